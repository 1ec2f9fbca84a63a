"""vLLM general plugin that installs the fast CPU multi-LoRA kernels.

Registered in ``pyproject.toml`` as ``[project.entry-points."vllm.general_plugins"]
essa_fast_lora = "engine.backends.fast_lora.plugin:register"``; vLLM calls :func:`register` in every
process it starts (the ``LLM`` process, EngineCore and its workers), possibly more than once, so
installing is idempotent.

The patch is one line: ``vllm.platforms.cpu.CpuPlatform.get_punica_wrapper`` (the class method the
LoRA model manager asks for the punica wrapper's qualified name) returns
``engine.backends.fast_lora.punica.FastPunicaWrapperCPU`` instead of vLLM's ``PunicaWrapperCPU``. No vLLM
file is modified; GPU, XPU and ROCm platforms are never touched.

The no-adapter fix (issue 17): vLLM 0.32's CPU torch ops (``vllm/lora/ops/torch_ops/lora_ops.py``)
select each token's weights as ``W[idx]``, and a token without an adapter has ``idx == -1``, so it
gets the LAST slot's adapter whenever that slot holds one (vLLM's GPU kernels skip -1). On the
versions in ``MASK_VLLM_VERSIONS`` :func:`install_no_lora_mask` makes the ops that vLLM's
``PunicaWrapperCPU`` calls see one extra all-zero slot, which is what -1 then selects; it is
installed on CPU whether the fast kernels are on or off (the fast wrapper falls back to these ops
while torch.compile traces). On other versions nothing in vLLM is patched and the back-end serves
no-adapter requests in a batch of their own (:func:`no_adapter_plan`).

An ISA cap below AVX-512 (``ONEDNN_MAX_CPU_ISA=AVX2`` or ``ATEN_CPU_CAPABILITY=avx2``, the AVX2 emulation):
:func:`follow_isa_cap` makes vLLM load its ``_C_AVX2`` kernel library (engine/hardware.py), which lacks
ops the full library has (the int4 GEMM), as on a real AVX2 CPU.

An ISA cap that switches AMX off (``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16`` on an AMX Xeon, the way the
docs emulate a CPU without AMX): :func:`follow_amx_cap` tells vLLM the CPU has no AMX, because oneDNN
never asked the kernel for the AMX registers and vLLM's AMX attention would die with SIGILL.

Switch (environment, read at engine start in each process):
    ESSA_FAST_LORA=1 (default) install on tested vLLM versions on CPU;
    ESSA_FAST_LORA=0 (also false/off/no) keep vLLM's own kernels;
    ESSA_FAST_LORA=force install also on untested vLLM versions (with a warning).
The run config's ``engine.fast_lora`` is turned into this variable by the back-end before vLLM
starts (the worker processes inherit it).
"""
from __future__ import annotations

import functools
import os

ENV_VAR = "ESSA_FAST_LORA"
TESTED_VLLM_VERSIONS = ("0.32.0",)
WRAPPER_QUALNAME = "engine.backends.fast_lora.punica.FastPunicaWrapperCPU"
_OFF = ("0", "false", "off", "no")

MASK_VLLM_VERSIONS = ("0.32.0",)
"""vLLM versions whose CPU torch LoRA ops apply the last slot to no-adapter tokens and whose op
signatures (inputs, lora weights (slots, ...), output, ...) :func:`install_no_lora_mask` was written
against. Extend only after reading that version's ``vllm/lora/ops/torch_ops/lora_ops.py``."""
MASKED_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")

_original_get_punica_wrapper = None
_original_ops: dict | None = None
_warned = False


def _logger():
    # A child of vLLM's "vllm" logger, so the line goes through vLLM's handler in every process.
    from vllm.logger import init_logger
    return init_logger("vllm.essa_fast_lora")


def switch() -> str:
    """The switch value: ``"on"``, ``"off"`` or ``"force"`` (from ``$ESSA_FAST_LORA``, default on)."""
    v = os.environ.get(ENV_VAR, "1").strip().lower()
    if v in _OFF:
        return "off"
    return "force" if v == "force" else "on"


def vllm_version() -> str:
    """vLLM's version without a local suffix (``0.32.0+cpu`` -> ``0.32.0``)."""
    import vllm
    return str(getattr(vllm, "__version__", "unknown")).split("+", 1)[0]


def is_installed() -> bool:
    """True when this process's CPU platform hands out ``FastPunicaWrapperCPU``."""
    try:
        from vllm.platforms.cpu import CpuPlatform
    except Exception:  # pragma: no cover - vLLM without the CPU platform module
        return False
    return CpuPlatform.get_punica_wrapper() == WRAPPER_QUALNAME


def install() -> None:
    """Point ``CpuPlatform.get_punica_wrapper`` at the fast wrapper (idempotent, no checks)."""
    global _original_get_punica_wrapper
    from vllm.platforms.cpu import CpuPlatform

    if is_installed():
        return
    import engine.backends.fast_lora.punica  # noqa: F401  (fail here, not inside vLLM, if it cannot import)

    _original_get_punica_wrapper = CpuPlatform.__dict__["get_punica_wrapper"]
    CpuPlatform.get_punica_wrapper = classmethod(lambda cls: WRAPPER_QUALNAME)


def uninstall() -> None:
    """Restore vLLM's own ``get_punica_wrapper`` and unmasked ops (for tests)."""
    global _original_get_punica_wrapper
    uninstall_no_lora_mask()
    if _original_get_punica_wrapper is None:
        return
    from vllm.platforms.cpu import CpuPlatform
    CpuPlatform.get_punica_wrapper = _original_get_punica_wrapper
    _original_get_punica_wrapper = None


def _with_zero_slot(op):
    """``op`` with an all-zero slot appended to its weights (dim 0), so the no-adapter id -1, which
    the op uses as a Python index, selects zeros instead of the last adapter. Adapter rows are
    computed exactly as before (same ops, same dtypes); a no-adapter row gets a zero delta."""
    import torch

    @functools.wraps(op)
    def masked(inputs, lora_weights, output_tensor, *args, **kwargs):
        zero = lora_weights.new_zeros((1, *lora_weights.shape[1:]))
        return op(inputs, torch.cat([lora_weights, zero]), output_tensor, *args, **kwargs)

    masked.essa_no_lora_mask = True
    return masked


def no_lora_mask_installed() -> bool:
    """True when vLLM's ``PunicaWrapperCPU`` in this process calls the masked ops."""
    try:
        from vllm.lora.punica_wrapper import punica_cpu
    except Exception:  # pragma: no cover - vLLM without the CPU punica wrapper
        return False
    return all(getattr(getattr(punica_cpu, name, None), "essa_no_lora_mask", False) for name in MASKED_OPS)


def install_no_lora_mask() -> None:
    """Point the torch ops that ``vllm.lora.punica_wrapper.punica_cpu`` calls at masked versions
    (:func:`_with_zero_slot`); idempotent, no version check (see ``MASK_VLLM_VERSIONS``).

    Only that module's names are replaced: ``vllm.lora.ops.torch_ops`` itself stays the reference.
    Both the stock ``PunicaWrapperCPU`` and ``FastPunicaWrapperCPU`` (its torch.compile fallback and
    ``apply_lora_full_linear``) resolve the ops there.
    """
    global _original_ops
    from vllm.lora.punica_wrapper import punica_cpu

    if no_lora_mask_installed():
        return
    _original_ops = {name: getattr(punica_cpu, name) for name in MASKED_OPS}
    for name, op in _original_ops.items():
        setattr(punica_cpu, name, _with_zero_slot(op))


def uninstall_no_lora_mask() -> None:
    """Give ``punica_cpu`` its own ops back (for tests)."""
    global _original_ops
    if _original_ops is None:
        return
    from vllm.lora.punica_wrapper import punica_cpu
    for name, op in _original_ops.items():
        setattr(punica_cpu, name, op)
    _original_ops = None


def _prompt_row_guard(add_lora_logits):
    """vLLM 0.32's ``PunicaWrapperCPU.add_lora_logits`` for prompt log-probabilities too.

    With ``prompt_logprobs`` vLLM computes logits for every prompt token, but the CPU wrapper indexes
    the LM-head LoRA by ``sampler_indices`` (one per request): ``einsum(): subscript b has size <requests>
    ... <prompt tokens>`` kills the engine (the class of vllm issues 16668, 29955). When the rows are
    not the sampled ones and no loaded adapter has LM-head weights (every ``lora_b`` slot zero, as for
    essa's q/k/v/o adapters), the LM-head delta is zero and the call returns without it; with LM-head
    weights it stops with one line instead. Rows that match run vLLM's op unchanged.
    """

    @functools.wraps(add_lora_logits)
    def guarded(self, y, x, lora_a_stacked, lora_b_stacked, scale, *args, **kwargs):
        rows = x.reshape(-1, x.shape[-1]).shape[0]
        if rows != self.sampler_indices.shape[0]:
            if not bool(lora_b_stacked.any()):
                return None
            raise RuntimeError("prompt log-probabilities under adapters with LM-head LoRA weights are not served by "
                               "vLLM 0.32's CPU LoRA ops; score with adapters on q/k/v/o only")
        return add_lora_logits(self, y, x, lora_a_stacked, lora_b_stacked, scale, *args, **kwargs)

    guarded.essa_prompt_row_guard = True
    return guarded


def install_prompt_row_guard() -> None:
    """Wrap vLLM's ``PunicaWrapperCPU.add_lora_logits`` in :func:`_prompt_row_guard` (idempotent; on the
    versions of ``MASK_VLLM_VERSIONS``, whose wrapper it was written against)."""
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    if not getattr(PunicaWrapperCPU.add_lora_logits, "essa_prompt_row_guard", False):
        PunicaWrapperCPU.add_lora_logits = _prompt_row_guard(PunicaWrapperCPU.add_lora_logits)


def follow_isa_cap() -> str | None:
    """Make ``torch.cpu._is_avx512_supported()`` / ``_is_avx512_bf16_supported()`` answer as the environment's
    ISA cap says (:func:`engine.hardware.capped_isa`: ``ONEDNN_MAX_CPU_ISA=AVX2`` or
    ``ATEN_CPU_CAPABILITY=avx2``), so that vLLM's ``import_kernels`` loads the kernel library of the emulated
    CPU class (``_C_AVX2``, ``_C_AVX512``) in this process instead of the full ``_C``.

    Returns:
        The library vLLM will now load when the cap changed it, else None.
    """
    import torch

    from engine import hardware

    real = (bool(torch.cpu._is_avx512_supported()), bool(torch.cpu._is_avx512_bf16_supported()))
    capped = hardware.capped_isa(*real)
    if capped == real:
        return None
    torch.cpu._is_avx512_supported = lambda: capped[0]
    torch.cpu._is_avx512_bf16_supported = lambda: capped[1]
    return hardware.kernel_library(*capped)


def follow_amx_cap() -> str | None:
    """Where ``ONEDNN_MAX_CPU_ISA`` (or ``DNNL_MAX_CPU_ISA``) switches AMX off on an AMX CPU (:func:`engine.hardware.amx_switched_off`),
    make ``torch.cpu._is_amx_tile_supported()`` answer False in this process, so vLLM's CPU attention takes
    its AVX-512 kernel instead of an AMX one that oneDNN never got the kernel's permission for (SIGILL).

    Returns:
        The cap (``"ONEDNN_MAX_CPU_ISA=<value>"``) when it patched torch, else None. Raises nothing of its
        own (a missing torch raises ImportError; :func:`register` logs any error and goes on).
    """
    from engine.hardware import amx_switched_off

    cap = amx_switched_off()
    if cap is not None:
        import torch
        torch.cpu._is_amx_tile_supported = lambda: False
    return cap


def no_adapter_plan(cpu: bool, mask: bool, fast: bool, enforce_eager: bool = True) -> str:
    """How a request without an adapter is kept on the base model when it shares a batch with
    adapter requests, in an engine started with these settings.

    Args:
        cpu: vLLM runs on its CPU back-end.
        mask: the no-adapter mask of vLLM's CPU ops is in place (:func:`register` ran, in the
            driver as in the engine's processes, on a version in ``MASK_VLLM_VERSIONS``;
            :func:`no_lora_mask_installed` in the driver after the engine started).
        fast: essa's fast kernels are installed in the engine (tested version, or forced).
        enforce_eager: no torch.compile; while compiling, the fast wrapper runs vLLM's torch ops.

    Returns:
        ``"gpu"`` (not CPU: vLLM's GPU kernels skip the no-adapter id -1), ``"mask"`` (vLLM's CPU
        ops masked; the fast kernels, when on, also give such tokens no delta), ``"fast"`` (the
        fast kernels alone, eager), or ``"split"`` (nothing in the engine guarantees it: the
        back-end must serve no-adapter requests in a ``generate`` call of their own).
    """
    if not cpu:
        return "gpu"
    if mask:
        return "mask"
    return "fast" if fast and enforce_eager else "split"


NO_ADAPTER_PLAN_TEXT = {
    "gpu": "vLLM's GPU LoRA kernels skip them (no-adapter id -1)",
    "mask": "vLLM's CPU LoRA ops with essa's no-adapter mask (id -1 selects an all-zero slot)",
    "fast": "essa's fast CPU LoRA kernels give them no delta",
    "split": "served in a generate call of their own (vLLM's CPU LoRA ops of this version apply the last "
             "LoRA slot to them)",
}
"""One line per :func:`no_adapter_plan` result, for the engine's start-up log."""


def register() -> None:
    """vLLM plugin entry point: install the fast CPU LoRA kernels when it is safe to.

    Installs only when (a) ``$ESSA_FAST_LORA`` is not off, (b) the platform is CPU, and (c) the
    vLLM version is in ``TESTED_VLLM_VERSIONS`` (or the switch says ``force``). On an untested
    version it logs one warning per process and leaves vLLM alone. Independently of the switch,
    on CPU with a vLLM version in ``MASK_VLLM_VERSIONS`` it installs the no-adapter mask of vLLM's
    own ops (:func:`install_no_lora_mask`) and the prompt-row guard of their LM-head LoRA
    (:func:`install_prompt_row_guard`). Never raises: a failure to install is logged and vLLM
    runs with its own kernels.
    """
    global _warned
    mode = switch()
    try:
        from vllm.platforms import current_platform
        if not current_platform.is_cpu():
            return
        log = _logger()
        cap = follow_amx_cap()
        if cap is not None:
            log.info("essa: %s switches AMX off; vLLM is told the CPU has no AMX (pid %d).", cap, os.getpid())
        kernels = follow_isa_cap()
        if kernels is not None:
            log.info("essa: the ISA cap (ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY) makes vLLM load %s (pid %d).",
                     kernels, os.getpid())
        version = vllm_version()
        if version in MASK_VLLM_VERSIONS and not no_lora_mask_installed():
            install_no_lora_mask()
            install_prompt_row_guard()
            log.info("essa: vLLM %s CPU LoRA ops masked for requests without an adapter, LM-head LoRA guarded for "
                     "prompt log-probabilities (pid %d).", version, os.getpid())
        if mode == "off":
            return
        if version not in TESTED_VLLM_VERSIONS and mode != "force":
            if not _warned:
                _warned = True
                log.warning(
                    "essa fast_lora: vLLM %s is not among the tested versions %s; keeping vLLM's own "
                    "CPU LoRA kernels (set %s=force to try anyway, %s=0 to silence this).",
                    version, ", ".join(TESTED_VLLM_VERSIONS), ENV_VAR, ENV_VAR)
            return
        if is_installed():
            return
        install()
        if version in TESTED_VLLM_VERSIONS:
            log.info("essa fast_lora: grouped-GEMM CPU LoRA kernels installed (vLLM %s, pid %d; %s=0 disables).",
                     version, os.getpid(), ENV_VAR)
        else:
            log.warning("essa fast_lora: installed on UNTESTED vLLM %s because %s=force (pid %d).",
                        version, ENV_VAR, os.getpid())
    except Exception as e:  # never break vLLM start-up
        try:
            _logger().warning("essa fast_lora: not installed (%s: %s); using vLLM's CPU LoRA kernels%s.",
                              type(e).__name__, e, "" if no_lora_mask_installed() else " without the no-adapter mask")
        except Exception:
            pass
