"""Fast CPU multi-LoRA kernels: stacked GEMMs instead of per-token weight gathers.

Multi-LoRA batching (Punica, Chen et al. 2023, arXiv 2310.18547; S-LoRA, Sheng et al. 2023,
arXiv 2311.03285) serves a batch of T tokens whose token t uses adapter ``idx[t]`` out of L
resident slots. vLLM 0.32's CPU reference ops (``vllm/lora/ops/torch_ops/lora_ops.py``) compute
this by gathering a private copy of every token's adapter matrices, ``W[idx]`` of shape
(T, r, in) or (T, out, r), and running a batched einsum: memory traffic T x r x in per slice and
per layer, which is what made 16 adapters cost 4x the base model on CPU.

Here every adapter is multiplied at once with plain GEMMs and the unwanted columns are masked:

    shrink:  S = x @ A_all^T            x (T, in), A_all (L*r, in)  -> S (T, L*r)
             S[t, l*r:(l+1)*r] *= onehot[t, l]     (zero for every slot but idx[t])
    expand:  y += S @ B_all             B_all (L*r, out) with B_all[l*r + j, o] = B[l, o, j]

Because the other adapters' columns of S are exactly zero, the expand GEMM adds exactly
``x A_{idx[t]}^T B_{idx[t]}^T`` to row t (the masked two-GEMM form). The cost is two GEMMs of
T x in x L*r and T x L*r x out per slice; at L = 16, r = 8 that is ~15 % of the base projection's
flops and no gather at all. For very large L x r (hundreds of adapters) sorting tokens by adapter
and running one small GEMM per adapter would win; at ESSA's P = 4..64 the stacked form measured
fastest (see ``engine/fast_lora/__init__.py``).

Index semantics: ``idx[t] == -1`` means "no adapter": the kernels leave row t of the output
untouched (what vLLM's Triton kernels do, ``_lora_expand_kernel`` exits early on -1). Note that
vLLM 0.32's torch reference ops instead index ``W[-1]``, i.e. they apply the LAST slot's adapter
to no-adapter tokens; that differs from the reference whenever the last slot is occupied (a
population that fills every slot plus a base-model request).

Dtypes: the ``bgmv_*``/``sgmv_*`` functions mirror the reference exactly, including its dtype
rule (inputs and weights are cast to the output tensor's dtype and the product is computed in
that dtype). :func:`lora_linear`, the fused path the punica wrapper uses, computes the shrink in the
input's dtype (bf16 in serving); the reference then casts its fp32 shrink result to bf16 before
the expand anyway, so both round the intermediate to bf16 once.
"""
from __future__ import annotations

import weakref
from typing import Sequence

import torch

__all__ = [
    "StackedLoRACache",
    "bgmv_expand",
    "bgmv_expand_slice",
    "bgmv_shrink",
    "lora_linear",
    "onehot_mask",
    "sgmv_expand",
    "sgmv_expand_slice",
    "sgmv_shrink",
    "stack_a",
    "stack_b",
]


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------

def onehot_mask(indices: torch.Tensor, num_slots: int, dtype: torch.dtype,
                scale: float = 1.0) -> torch.Tensor:
    """Token-to-slot selection matrix.

    Args:
        indices: (T,) int64 slot per token, -1 = no adapter.
        num_slots: L, the number of adapter slots.
        dtype: dtype of the result.
        scale: value written at the selected entries.

    Returns:
        (T, L) tensor: ``scale`` at ``[t, indices[t]]`` where ``indices[t] >= 0``, zero elsewhere
        (an all-zero row for -1).
    """
    valid = indices >= 0
    m = torch.zeros(indices.shape[0], num_slots, dtype=dtype, device=indices.device)
    m[valid, indices[valid]] = scale
    return m


def _as_3d(w: torch.Tensor) -> torch.Tensor:
    """vLLM's stacked weights are (L, 1, a, b) (one layer) or (L, a, b); return (L, a, b)."""
    if w.dim() == 4:
        if w.shape[1] != 1:
            raise ValueError(f"stacked LoRA weights must be (L, 1, a, b); got {tuple(w.shape)}")
        return w.squeeze(1)
    if w.dim() != 3:
        raise ValueError(f"stacked LoRA weights must be (L, a, b) or (L, 1, a, b); got {tuple(w.shape)}")
    return w


def stack_a(lora_a: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """(L, [1,] r, in) LoRA-A slots -> (L*r, in): row l*r + j is row j of slot l's A."""
    a = _as_3d(lora_a)
    out = a.reshape(a.shape[0] * a.shape[1], a.shape[2])
    return out if dtype is None else out.to(dtype)


def stack_b(lora_b: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """(L, [1,] out, r) LoRA-B slots -> (L*r, out) with ``[l*r + j, o] = B[l, o, j]`` (a copy)."""
    b = _as_3d(lora_b)
    if dtype is not None:
        b = b.to(dtype)
    return b.transpose(1, 2).reshape(b.shape[0] * b.shape[2], b.shape[1])


def _write_rows(out: torch.Tensor, new: torch.Tensor, valid: torch.Tensor, add: bool) -> None:
    """``out += new`` (add) or ``out[valid] = new[valid]`` (assign); -1 rows stay untouched.

    With ``add`` the caller guarantees ``new`` is zero on invalid rows (masked GEMM), so a plain
    in-place add leaves them unchanged.
    """
    if add:
        out += new
    else:
        out.copy_(torch.where(valid.view(-1, 1), new, out))


# ---------------------------------------------------------------------------------------------
# Drop-in replacements of vllm.lora.ops.torch_ops (same signatures, -1 = no adapter)
# ---------------------------------------------------------------------------------------------

def bgmv_shrink(inputs: torch.Tensor, lora_a_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, scaling: float = 1.0) -> None:
    """Per-token LoRA-A projection.

    Semantics::

        for t in range(T):
            if idx[t] >= 0:
                output[t, :r] = scaling * inputs[t] @ A[idx[t]].T

    Args:
        inputs: (T, in).
        lora_a_weights: (L, 1, r, in) or (L, r, in).
        output_tensor: (T, >= r), written in place; the product is computed in its dtype.
        lora_indices_tensor: (T,) int64, slot per token, -1 = no adapter (row left untouched).
        scaling: multiplies the product.
    """
    dt = output_tensor.dtype
    a = _as_3d(lora_a_weights)
    L, r = a.shape[0], a.shape[1]
    idx = lora_indices_tensor
    t = inputs.shape[0]
    s = torch.mm(inputs.to(dt), stack_a(a, dt).t()).view(t, L, r)  # every slot at once
    s = s[torch.arange(t, device=idx.device), idx.clamp_min(0)]  # (T, r): each token's slot
    if scaling != 1.0:
        s = s * scaling
    _write_rows(output_tensor[:, :r], s, idx >= 0, add=False)


def bgmv_expand(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, add_inputs: bool = True) -> None:
    """Per-token LoRA-B projection into the leading columns of ``output_tensor``.

    Semantics::

        for t in range(T):
            if idx[t] >= 0:
                c = min(out, output.shape[1])
                output[t, :c] (+)= (inputs[t] @ B[idx[t]].T)[:c]

    Args:
        inputs: (T, r).
        lora_b_weights: (L, 1, out, r) or (L, out, r).
        output_tensor: (T, out'), written in place; computed in its dtype. As in the reference,
            a single input row with a multi-row output is broadcast to every row.
        lora_indices_tensor: (T,) int64, -1 = no adapter (row left untouched).
        add_inputs: add to (True) or overwrite (False) the output.
    """
    dt = output_tensor.dtype
    b = _as_3d(lora_b_weights)
    L, r = b.shape[0], b.shape[2]
    idx = lora_indices_tensor
    t = inputs.shape[0]
    z = (inputs[:, :r].to(dt).view(t, 1, r) * onehot_mask(idx, L, dt).view(t, L, 1)).view(t, L * r)
    outputs = torch.mm(z, stack_b(b, dt))  # (T, out)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    c = min(outputs.shape[1], output_tensor.shape[1])
    _write_rows(output_tensor[:, :c], outputs[:limit, :c], (idx >= 0)[:limit], add=add_inputs)


def bgmv_expand_slice(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                      lora_indices_tensor: torch.Tensor, slice_offset: int, slice_size: int,
                      add_inputs: bool = True) -> None:
    """Per-token LoRA-B projection into columns ``[slice_offset, slice_offset + slice_size)``.

    Semantics::

        for t in range(T):
            if idx[t] >= 0:
                output[t, off:off+size] (+)= inputs[t] @ B[idx[t]].T     # B: (out = size, r)

    Args:
        inputs: (T, r).
        lora_b_weights: (L, 1, size, r) or (L, size, r).
        output_tensor: (T, >= slice_offset + slice_size), written in place; computed in its dtype.
        lora_indices_tensor: (T,) int64, -1 = no adapter (row left untouched).
        slice_offset, slice_size: the column window of ``output_tensor``.
        add_inputs: add to (True) or overwrite (False) the window.

    Raises:
        ValueError: ``slice_size`` differs from the weights' output dimension.
    """
    dt = output_tensor.dtype
    b = _as_3d(lora_b_weights)
    L, out, r = b.shape
    if out != slice_size:
        raise ValueError(f"slice_size={slice_size} but lora_b_weights have out={out}")
    idx = lora_indices_tensor
    t = inputs.shape[0]
    z = (inputs[:, :r].to(dt).view(t, 1, r) * onehot_mask(idx, L, dt).view(t, L, 1)).view(t, L * r)
    outputs = torch.mm(z, stack_b(b, dt))
    _write_rows(output_tensor[:, slice_offset:slice_offset + slice_size], outputs, idx >= 0, add=add_inputs)


def _explode(lora_indices_tensor: torch.Tensor, seq_len_tensor: torch.Tensor) -> torch.Tensor:
    """Per-sequence slot ids (B,) and lengths (B,) -> per-token slot ids (T,)."""
    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def sgmv_shrink(inputs, lora_a_weights, output_tensor, b_seq_start_loc, seq_len_tensor,
                lora_indices_tensor, batches, max_seq_length, token_nums, scaling: float) -> None:
    """:func:`bgmv_shrink` with per-sequence ids (vLLM's prefill metadata); same semantics."""
    bgmv_shrink(inputs, lora_a_weights, output_tensor, _explode(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor,
                lora_indices_tensor, batches, max_seq_length, token_nums, add_inputs: bool = False) -> None:
    """:func:`bgmv_expand` with per-sequence ids (vLLM's prefill metadata); same semantics."""
    bgmv_expand(inputs, lora_b_weights, output_tensor, _explode(lora_indices_tensor, seq_len_tensor), add_inputs)


def sgmv_expand_slice(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor,
                      lora_indices_tensor, batches, max_seq_length, token_nums, slice_offset: int,
                      slice_size: int, add_inputs: bool = False) -> None:
    """:func:`bgmv_expand_slice` with per-sequence ids (vLLM's prefill metadata); same semantics."""
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor, _explode(lora_indices_tensor, seq_len_tensor),
                      slice_offset, slice_size, add_inputs)


# ---------------------------------------------------------------------------------------------
# Fused path: all slices of one layer (q, k, v) in one shrink GEMM, cached stacked weights
# ---------------------------------------------------------------------------------------------

class StackedLoRACache:
    """Stacked copies of each layer's LoRA slots, rebuilt only when the slots change.

    vLLM keeps per layer a tuple of n slices (q/k/v: n = 3), each ``lora_a`` (L, 1, r, in) and
    ``lora_b`` (L, 1, out_i, r), updated in place when an adapter is loaded into a slot. The fused
    kernel wants ``A_all`` (n*L*r, in) and per slice ``B_all_i`` (L*r, out_i). Entries are keyed by
    the identity of the layer's first A tensor and invalidated when any of the layer's tensors'
    version counters moves or when :meth:`invalidate` is called (the punica wrapper calls it when
    the slot layout changes, which also covers inference tensors that have no version counter).

    Memory: one extra copy of the stacked LoRA weights (about 20 MB at L = 16 for the 135M model).
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple] = {}
        self.epoch = 0
        self.builds = 0

    def invalidate(self) -> None:
        """Drop every entry (slot contents changed)."""
        self._entries.clear()
        self.epoch += 1

    @staticmethod
    def _versions(tensors: Sequence[torch.Tensor]) -> tuple | None:
        try:
            return tuple(t._version for t in tensors)
        except RuntimeError:  # inference tensors have no version counter
            return None

    def get(self, lora_a_stacked: Sequence[torch.Tensor], lora_b_stacked: Sequence[torch.Tensor],
            dtype: torch.dtype) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Return ``(A_all (n*L*r, in), [B_all_i (L*r, out_i)])`` in ``dtype``, cached."""
        tensors = (*lora_a_stacked, *lora_b_stacked)
        key = id(lora_a_stacked[0])
        versions = self._versions(tensors)
        hit = self._entries.get(key)
        if hit is not None:
            ref, epoch, vers, hdtype, a_all, b_all = hit
            if ref() is lora_a_stacked[0] and epoch == self.epoch and vers == versions and hdtype == dtype:
                return a_all, b_all
        a_all, b_all = build_stacked(lora_a_stacked, lora_b_stacked, dtype)
        self._entries[key] = (weakref.ref(lora_a_stacked[0]), self.epoch, versions, dtype, a_all, b_all)
        self.builds += 1
        return a_all, b_all


def build_stacked(lora_a_stacked: Sequence[torch.Tensor], lora_b_stacked: Sequence[torch.Tensor],
                  dtype: torch.dtype) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Uncached ``(A_all (n*L*r, in), [B_all_i (L*r, out_i)])`` for :func:`lora_linear`."""
    a_all = torch.cat([stack_a(a, dtype) for a in lora_a_stacked], 0)
    b_all = [stack_b(b, dtype) for b in lora_b_stacked]
    return a_all, b_all


def lora_linear(y: torch.Tensor, x: torch.Tensor, a_all: torch.Tensor, b_all: Sequence[torch.Tensor],
                mask: torch.Tensor, output_slices: Sequence[int], offset_start: int = 0) -> None:
    """Fused multi-LoRA delta of one (possibly packed) linear layer, in place.

    Semantics (n slices, e.g. q/k/v packed into one output)::

        off = offset_start
        for i in range(n):
            y[t, off:off+o_i] += mask[t, idx[t]] * x[t] @ A_i[idx[t]].T @ B_i[idx[t]].T   for every t
            off += o_i

    Args:
        y: (T, >= offset_start + sum(o_i)) layer output, updated in place.
        x: (T, in) layer input; the GEMMs run in ``x``'s dtype.
        a_all: (n*L*r, in), slices stacked slice-major then slot-major (:func:`build_stacked`).
        b_all: n tensors (L*r, o_i).
        mask: (T, L) from :func:`onehot_mask` (scale folded in; all-zero row = no adapter).
        output_slices: (o_1, ..., o_n).

    Raises:
        ValueError: shapes disagree.
    """
    t, L = mask.shape
    n = len(b_all)
    if x.shape[0] != t:
        raise ValueError(f"x has {x.shape[0]} rows but the LoRA mapping has {t} tokens")
    if a_all.shape[0] % (n * L):
        raise ValueError(f"a_all rows {a_all.shape[0]} not divisible by n*L = {n * L}")
    s = torch.mm(x, a_all.t()).view(t, n, L, -1)  # (T, n, L, r)
    s = (s * mask.view(t, 1, L, 1)).view(t, n, -1)  # zero outside each token's slot
    off = offset_start
    for i, (b, o) in enumerate(zip(b_all, output_slices)):
        y[:, off:off + o] += torch.mm(s[:, i], b)  # (T, L*r) @ (L*r, o)
        off += o
