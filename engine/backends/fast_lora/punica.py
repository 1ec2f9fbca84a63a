"""``FastPunicaWrapperCPU``: vLLM's CPU punica wrapper with the grouped-GEMM kernels of ``ops``.

vLLM routes every LoRA layer's work through one punica wrapper per model, picked by
``current_platform.get_punica_wrapper()`` (a qualified class name). The plugin
(``engine.backends.fast_lora.plugin``) points the CPU platform at this class; nothing else in vLLM changes.

What is overridden (vLLM 0.32.0, ``vllm/lora/punica_wrapper/punica_cpu.py``):

- ``update_metadata``: also invalidates the per-slot weight cache when the slot layout changes and
  drops the per-step token plan.
- ``add_lora_linear`` (every q/k/v/o and MLP LoRA layer): skipped when no slot of the layer holds
  weights (vLLM also wraps the MLP when adapters only target attention); otherwise all slices and
  slots in one grouped pass (:func:`engine.backends.fast_lora.ops.lora_linear`, tokens grouped once per
  LoRA mapping by :func:`engine.backends.fast_lora.ops.plan_tokens`) instead of 2 x n gather-and-einsum
  calls. Inside a torch.compile trace it defers to vLLM's own implementation.
- ``add_lora_logits`` (the LM head, every decode step) and ``add_lora_embedding``: skipped when no
  request/token of the batch maps to a slot whose weights for that layer are non-zero
  (:meth:`engine.backends.fast_lora.ops.SlotWeightCache.nonzero_slots`): vLLM wraps the LM head whenever
  LoRA is on, although ESSA's adapters (q/k/v/o) never target it, and the (T, L*r) @ (L*r, vocab)
  expand over every slot cost as much as the rest of a decode step. Skipping adds exactly zero
  less, so outputs are unchanged bit for bit.
- ``add_shrink``, ``add_expand``, ``add_lora_embedding``, ``add_lora_logits``: the drop-in
  ``bgmv_*`` kernels of ``ops`` with per-token indices (prefill and decode alike: vLLM's v1
  runner always marks batches as prefill on CPU, and the per-token ids equal the exploded
  per-sequence ids the reference ``sgmv_*`` ops build).

``apply_lora_full_linear`` (classification heads) stays vLLM's.

Importing this module imports vLLM; the plugin imports it only inside engine processes.
"""
from __future__ import annotations

from typing import Any

import torch
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

from engine.backends.fast_lora import ops


def _compiling() -> bool:
    """True while torch.compile traces (Python-side caches must not be used then)."""
    try:
        return torch.compiler.is_compiling()
    except AttributeError:  # pragma: no cover - old torch
        return False


class FastPunicaWrapperCPU(PunicaWrapperCPU):
    """Punica wrapper for vLLM's CPU back-end that runs multi-LoRA as grouped GEMMs.

    Same constructor and public methods as ``PunicaWrapperCPU``; outputs agree with vLLM's torch
    reference ops up to summation order, except that a token with no adapter (slot id -1) gets no
    LoRA delta, as on vLLM's GPU kernels (the 0.32 torch ops apply the last slot's adapter to it).
    """

    def __init__(self, max_num_batched_tokens: int, max_batches: int, device: torch.device | str, **kwargs):
        super().__init__(max_num_batched_tokens, max_batches, device, **kwargs)
        self._weights = ops.SlotWeightCache()
        self._slot_layout: tuple | None = None
        self._plans: dict[tuple, ops.TokenPlan] = {}
        self._used: dict[str, bool] = {}

    # -- metadata ------------------------------------------------------------------------------

    def update_metadata(self, mapping, lora_index_to_id: list[int | None], max_loras: int,
                        vocab_size: int, **kwargs) -> None:
        """vLLM's metadata update, plus cache invalidation when adapters moved between slots."""
        super().update_metadata(mapping, lora_index_to_id, max_loras, vocab_size, **kwargs)
        layout = tuple(lora_index_to_id)
        if layout != self._slot_layout:
            self._weights.invalidate()
            self._slot_layout = layout
        self._plans.clear()
        self._used.clear()

    def _skip(self) -> bool:
        """The whole batch is on the base model (vLLM's own early exit in prefill mode)."""
        return self.is_prefill and self.no_lora

    def _uses_weights(self, kind: str, indices: torch.Tensor, lora_a_stacked: tuple[torch.Tensor, ...],
                      lora_b_stacked: tuple[torch.Tensor, ...]) -> bool:
        """True when an index of this step (``indices`` (T,), -1 = no adapter) points at a slot whose
        weights are non-zero for this layer; decided once per step and ``kind`` ("logits", "embedding")."""
        used = self._used.get(kind)
        if used is None:
            nz = self._weights.nonzero_slots(lora_a_stacked, lora_b_stacked)  # (L,)
            idx = indices[indices >= 0]
            used = self._used[kind] = bool(nz[idx].any()) if idx.numel() else False
        return used

    def _plan(self, num_slots: int) -> ops.TokenPlan:
        """This step's token grouping (built on the first LoRA layer, reused by the others and by
        later steps until vLLM changes the mapping)."""
        plan = self._plans.get(num_slots)
        if plan is None:
            plan = self._plans[num_slots] = ops.plan_tokens(self.token_lora_indices, num_slots)
        return plan

    # -- LoRA entry points ---------------------------------------------------------------------

    def add_lora_linear(self, y: torch.Tensor, x: torch.Tensor, lora_a_stacked: tuple[torch.Tensor, ...],
                        lora_b_stacked: tuple[torch.Tensor, ...], scale: float,
                        output_slices: tuple[int, ...], *, buffer: tuple[torch.Tensor, ...] | None = None,
                        **kwargs: Any) -> None:
        """``y[:, slice_i] += scale * x @ A_i[idx]^T @ B_i[idx]^T`` for every slice i, in place.

        Args:
            y: (T, sum(output_slices)) layer output (or (1, T, .)).
            x: (T, in) layer input (or (1, T, in)).
            lora_a_stacked: n tensors (L, 1, r, in); lora_b_stacked: n tensors (L, 1, o_i, r).
            scale: multiplies the delta (vLLM passes 1.0; the LoRA scaling is folded into B).
            output_slices: (o_1, ..., o_n).
            buffer: accepted for signature compatibility and not used (the fused kernel keeps its
                intermediate in ``x``'s dtype instead of a float32 buffer).
        """
        assert len(lora_a_stacked) == len(lora_b_stacked) == len(output_slices)
        if _compiling():  # Python-side plans and caches do not belong in a traced graph
            return super().add_lora_linear(y, x, lora_a_stacked, lora_b_stacked, scale, output_slices,
                                           buffer=buffer, **kwargs)
        if self._skip():
            return
        x2 = x.reshape(-1, x.shape[-1])
        y2 = y.view(-1, y.shape[-1])
        plan = self._plan(lora_a_stacked[0].shape[0])
        if plan.mode == "none" or self._weights.is_zero(lora_a_stacked, lora_b_stacked, x2.dtype):
            return
        a_slot, b_slot = self._weights.get(lora_a_stacked, lora_b_stacked, x2.dtype)
        units = self._weights.get_units(lora_a_stacked, lora_b_stacked, x2.dtype, plan)
        ops.lora_linear(y2, x2, a_slot, b_slot, plan, scale, unit_weights=units)

    def add_shrink(self, y, x: torch.Tensor, lora_a_stacked: tuple[torch.Tensor, ...], scale: float,
                   **kwargs: Any) -> None:
        """``y[i][t] = scale * x[t] @ A_i[idx[t]]^T`` per slice i (rows with idx -1 untouched)."""
        if self._skip():
            return
        x = x.view(-1, x.shape[-1])
        for i, a in enumerate(lora_a_stacked):
            yi = y[i]
            ops.bgmv_shrink(x, a, yi.view(-1, yi.shape[-1]), self.token_lora_indices, scale)

    def add_expand(self, y: torch.Tensor, x, lora_b_stacked: tuple[torch.Tensor, ...],
                   output_slices: tuple[int, ...], offset_start: int = 0, add_inputs=True,
                   **kwargs: Any) -> None:
        """``y[:, off_i:off_i+o_i] (+)= x[i] @ B_i[idx]^T`` per slice i (rows with idx -1 untouched)."""
        if self._skip():
            return
        y2 = y.view(-1, y.shape[-1])
        off = offset_start
        for i, b in enumerate(lora_b_stacked):
            ops.bgmv_expand_slice(x[i], b, y2, self.token_lora_indices, off, output_slices[i], add_inputs)
            off += output_slices[i]

    def add_lora_embedding(self, y: torch.Tensor, x: torch.Tensor, lora_b_stacked: torch.Tensor,
                           add_inputs: bool = True, **kwargs: Any) -> None:
        """``y (+)= x @ B[idx]^T`` for the embedding layer's LoRA (expand only); nothing when no token
        of the batch uses a slot with embedding weights."""
        if self._skip() or (not _compiling()
                            and not self._uses_weights("embedding", self.token_lora_indices, (), (lora_b_stacked,))):
            return
        ops.bgmv_expand(x, lora_b_stacked, y, self.token_lora_indices, add_inputs)

    def add_lora_logits(self, y: torch.Tensor, x: torch.Tensor, lora_a_stacked: torch.Tensor,
                        lora_b_stacked: torch.Tensor, scale, *, buffer: torch.Tensor | None = None,
                        **kwargs: Any) -> None:
        """``y += (scale * x @ A[idx]^T) @ B[idx]^T`` per request (LM-head LoRA, sampler ids); nothing
        when no request of the batch uses a slot with LM-head weights (no adapter targets lm_head)."""
        if not _compiling() and not self._uses_weights("logits", self.sampler_indices, (lora_a_stacked,),
                                                       (lora_b_stacked,)):
            return
        y2 = y.view(-1, y.shape[-1])
        x2 = x.view(-1, x.shape[-1])
        r = lora_b_stacked.size(-1)
        if buffer is None:
            buffer = torch.zeros((x2.size(0), r), dtype=torch.float32, device=x2.device)
        ops.bgmv_shrink(x2, lora_a_stacked, buffer, self.sampler_indices, scale)
        ops.bgmv_expand(buffer, lora_b_stacked, y2, self.sampler_indices, add_inputs=True)
