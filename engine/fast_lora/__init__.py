"""Fast multi-LoRA on vLLM's CPU back-end, installed as a vLLM plugin (no fork of vLLM).

ESSA evaluates a whole population as LoRA adapters in one vLLM ``generate`` call (multi-LoRA
batching: Punica, arXiv 2310.18547; S-LoRA, arXiv 2311.03285). EGGROLL (arXiv 2511.16652)
reports population evaluation at 91 % of pure batch-inference throughput; with vLLM 0.32's CPU
LoRA ops it ran at a quarter of it here, because those ops gather a private copy of each token's
adapter matrices and run a batched einsum.

- ``ops``: stacked-GEMM kernels (one GEMM against every adapter at once, a per-token mask, one
  GEMM against every adapter's B): drop-in ``bgmv_*``/``sgmv_*`` replacements of
  ``vllm.lora.ops.torch_ops`` and the fused per-layer ``lora_linear``. Imports only torch.
- ``punica``: ``FastPunicaWrapperCPU``, vLLM's CPU punica wrapper using them (imports vLLM).
- ``plugin``: the ``vllm.general_plugins`` entry point ``register()``; switch ``$ESSA_FAST_LORA``
  (``1`` default, ``0`` off, ``force`` on untested vLLM versions).
"""
from .plugin import ENV_VAR, TESTED_VLLM_VERSIONS, WRAPPER_QUALNAME

__all__ = ["ENV_VAR", "TESTED_VLLM_VERSIONS", "WRAPPER_QUALNAME"]
