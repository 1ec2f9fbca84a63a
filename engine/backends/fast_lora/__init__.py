"""Fast multi-LoRA on vLLM's CPU back-end, installed as a vLLM plugin (no fork of vLLM).

ESSA evaluates a whole population as LoRA adapters in one vLLM ``generate`` call (multi-LoRA
batching: Punica, arXiv 2310.18547; S-LoRA, arXiv 2311.03285). EGGROLL (arXiv 2511.16652)
reports population evaluation at 91 % of pure batch-inference throughput; with vLLM 0.32's CPU
LoRA ops it ran at a quarter of it here, because those ops gather a private copy of each token's
adapter matrices and run a batched einsum.

- ``ops``: the kernels. ``lora_linear`` groups the tokens by adapter and runs every group through
  batched GEMMs (all q/k/v slices at once, no per-token copies of weights); drop-in
  ``bgmv_*``/``sgmv_*`` replacements of ``vllm.lora.ops.torch_ops`` (one GEMM against every
  adapter stacked, then a per-token mask). Imports only torch.
- ``punica``: ``FastPunicaWrapperCPU``, vLLM's CPU punica wrapper using them (imports vLLM).
- ``plugin``: the ``vllm.general_plugins`` entry point ``register()``; switch ``$ESSA_FAST_LORA``
  (``1`` default, ``0`` off, ``force`` on untested vLLM versions). On vLLM 0.32 it also masks
  vLLM's own CPU LoRA ops, whatever the switch, so requests without an adapter get no delta.
"""
from engine.backends.fast_lora.plugin import ENV_VAR, TESTED_VLLM_VERSIONS, WRAPPER_QUALNAME

__all__ = ["ENV_VAR", "TESTED_VLLM_VERSIONS", "WRAPPER_QUALNAME"]
