"""vLLM general plugin that installs the fast CPU multi-LoRA kernels.

Registered in ``pyproject.toml`` as ``[project.entry-points."vllm.general_plugins"]
essa_fast_lora = "engine.fast_lora.plugin:register"``; vLLM calls :func:`register` in every
process it starts (the ``LLM`` process, EngineCore and its workers), possibly more than once, so
installing is idempotent.

The patch is one line: ``vllm.platforms.cpu.CpuPlatform.get_punica_wrapper`` (the class method the
LoRA model manager asks for the punica wrapper's qualified name) returns
``engine.fast_lora.punica.FastPunicaWrapperCPU`` instead of vLLM's ``PunicaWrapperCPU``. No vLLM
file is modified; GPU, XPU and ROCm platforms are never touched.

Switch (environment, read at engine start in each process):
    ESSA_FAST_LORA=1 (default) install on tested vLLM versions on CPU;
    ESSA_FAST_LORA=0 (also false/off/no) keep vLLM's own kernels;
    ESSA_FAST_LORA=force install also on untested vLLM versions (with a warning).
The run config's ``engine.fast_lora`` is turned into this variable by the back-end before vLLM
starts (the worker processes inherit it).
"""
from __future__ import annotations

import os

ENV_VAR = "ESSA_FAST_LORA"
TESTED_VLLM_VERSIONS = ("0.32.0",)
WRAPPER_QUALNAME = "engine.fast_lora.punica.FastPunicaWrapperCPU"
_OFF = ("0", "false", "off", "no")

_original_get_punica_wrapper = None
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
    import engine.fast_lora.punica  # noqa: F401  (fail here, not inside vLLM, if it cannot import)

    _original_get_punica_wrapper = CpuPlatform.__dict__["get_punica_wrapper"]
    CpuPlatform.get_punica_wrapper = classmethod(lambda cls: WRAPPER_QUALNAME)


def uninstall() -> None:
    """Restore vLLM's own ``get_punica_wrapper`` (for tests)."""
    global _original_get_punica_wrapper
    if _original_get_punica_wrapper is None:
        return
    from vllm.platforms.cpu import CpuPlatform
    CpuPlatform.get_punica_wrapper = _original_get_punica_wrapper
    _original_get_punica_wrapper = None


def register() -> None:
    """vLLM plugin entry point: install the fast CPU LoRA kernels when it is safe to.

    Installs only when (a) ``$ESSA_FAST_LORA`` is not off, (b) the platform is CPU, and (c) the
    vLLM version is in ``TESTED_VLLM_VERSIONS`` (or the switch says ``force``). On an untested
    version it logs one warning per process and leaves vLLM alone. Never raises: a failure to
    install is logged and vLLM runs with its own kernels.
    """
    global _warned
    mode = switch()
    if mode == "off":
        return
    try:
        from vllm.platforms import current_platform
        if not current_platform.is_cpu():
            return
        log = _logger()
        version = vllm_version()
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
            _logger().warning("essa fast_lora: not installed (%s: %s); using vLLM's CPU LoRA kernels.",
                              type(e).__name__, e)
        except Exception:
            pass
