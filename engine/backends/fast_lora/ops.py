"""Fast CPU multi-LoRA kernels: grouped batched GEMMs instead of per-token weight gathers.

Multi-LoRA batching (Punica, Chen et al. 2023, arXiv 2310.18547; S-LoRA, Sheng et al. 2023,
arXiv 2311.03285) serves a batch of T tokens whose token t uses the adapter in slot ``idx[t]``
out of L resident slots. vLLM 0.32's CPU reference ops (``vllm/lora/ops/torch_ops/lora_ops.py``)
gather a private copy of every token's adapter matrices, ``W[idx]`` of shape (T, r, in) or
(T, out, r), cast it, and run a batched einsum, separately for every slice (q, k, v) and for
shrink and expand: ~12 tensor ops and T x r x in bytes of copying per slice and layer. On a
2-core CPU that made 16 adapters cost 4x the base model.

Here the tokens are grouped by adapter and every group runs as plain batched GEMMs (Punica's
SGMV idea, done with ``torch.bmm``): cut the batch into U units of G rows, each unit on one slot::

    xg = x.view(U, G, in)          (or x[perm] when the tokens must be gathered and padded)
    S  = xg @ A_unit^T             A_unit (U, n*r, in)          -> (U, G, n*r)
    y.view(U, G, -1) += S @ B_unit B_unit (U, n*r, sum o_i)     (one baddbmm_, in place)

The minimal flops (times the padding), all slices of a packed layer (q, k, v) at once, two ops
when no gather is needed. That is the common case: vLLM keeps each request's tokens together and
an ESSA population's requests come as P groups of B, so a decode step is P equal runs
(:func:`plan_tokens`, once per change of vLLM's LoRA mapping, which stays fixed over many decode
steps). The per-slot weights are stacked once per adapter load (:func:`build_slot_weights`):
``A_slot`` (L+1, n*r, in) and ``B_slot`` (L+1, n*r, sum o_i), block-diagonal in each slot (slice
i's r rows feed only slice i's output columns), slot L all zero for tokens without an adapter.

The alternative "stack every adapter and mask" form (one GEMM x @ A_all^T against all L slots,
zero the other slots' columns, one GEMM against all B stacked) needs no grouping but costs L times
the flops, and its rounding depends on a slot's position inside the stacked K dimension, so it was
dropped: measured at L=16, T=256 (1 thread, ms per q/k/v call) it took 0.77 against 0.13 grouped.

Measured (1 thread, bf16, in 576, r 8, q/k/v packed, ms per layer call; base = the layer's own
projection): L=16, T=256: base 0.58, grouped 0.13 (no gather) / 0.18 (gathered), vLLM's ops
2.7; L=48, T=768: base 1.67, grouped 0.31 / 0.46.

Index semantics: ``idx[t] == -1`` means "no adapter": the kernels leave row t of the output
untouched (grouped maps it to the zero slot L). This is what vLLM's Triton kernels do
(``_lora_expand_kernel`` exits early on -1). vLLM 0.32's torch reference ops instead index
``W[-1]``, i.e. they apply the LAST slot's adapter to no-adapter tokens; results differ from that
reference whenever the last slot holds an adapter and a request runs without one.

Dtypes: the ``bgmv_*``/``sgmv_*`` drop-ins mirror the reference's rule (inputs and weights are cast
to the output tensor's dtype and multiplied in it). :func:`lora_linear`, the fused path the punica
wrapper uses, multiplies in the input's dtype (bf16 in serving); the reference casts its fp32
shrink result to bf16 before the expand anyway, so both round the intermediate to bf16 once.
"""
from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass, field
from typing import Sequence

import torch

__all__ = [
    "UNIT_COST_ROWS",
    "SlotWeightCache",
    "TokenPlan",
    "bgmv_expand",
    "bgmv_expand_slice",
    "bgmv_shrink",
    "build_slot_weights",
    "lora_linear",
    "onehot_mask",
    "plan_tokens",
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
# Fused path: every slice of one layer (q, k, v packed) in one pass, cached per-slot weights
# ---------------------------------------------------------------------------------------------

def build_slot_weights(lora_a_stacked: Sequence[torch.Tensor], lora_b_stacked: Sequence[torch.Tensor],
                       dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-slot weights of one layer's n LoRA slices, plus an all-zero slot for "no adapter".

    Args:
        lora_a_stacked: n tensors (L, [1,] r, in) (vLLM's ``lora_a_stacked``).
        lora_b_stacked: n tensors (L, [1,] o_i, r) (vLLM's ``lora_b_stacked``).
        dtype: dtype of the results.

    Returns:
        ``A_slot`` (L+1, n*r, in): rows ``i*r:(i+1)*r`` of slot l are slice i's A.
        ``B_slot`` (L+1, n*r, sum o_i): block-diagonal per slot, ``B_slot[l, i*r + j, off_i + o]
        = B_i[l, o, j]`` and zero outside slice i's block. Slot L is zero in both.
    """
    a = [_as_3d(t) for t in lora_a_stacked]
    b = [_as_3d(t) for t in lora_b_stacked]
    L, r, d_in = a[0].shape
    n = len(a)
    outs = [t.shape[1] for t in b]
    a_slot = torch.zeros(L + 1, n * r, d_in, dtype=dtype, device=a[0].device)
    b_slot = torch.zeros(L + 1, n * r, sum(outs), dtype=dtype, device=a[0].device)
    off = 0
    for i in range(n):
        a_slot[:L, i * r:(i + 1) * r] = a[i]
        b_slot[:L, i * r:(i + 1) * r, off:off + outs[i]] = b[i].transpose(1, 2)
        off += outs[i]
    return a_slot, b_slot


class SlotWeightCache:
    """:func:`build_slot_weights` per layer, rebuilt only when that layer's slots change, and the
    per-unit weights a grouped :class:`TokenPlan` gathers from them, rebuilt only when the plan does.

    vLLM updates each layer's ``lora_a_stacked``/``lora_b_stacked`` in place when it loads an
    adapter into a slot. Entries are keyed by the identity of the layer's first A tensor and are
    stale when any of the layer's tensors' version counters moved or after :meth:`invalidate`
    (the punica wrapper calls it whenever the slot layout changes, which also covers tensors
    without a version counter, e.g. inference tensors). vLLM keeps a batch's LoRA mapping, hence
    the plan, across decode steps until a request joins or leaves, so the gathered unit weights
    are reused for many steps.

    Memory: one copy of the stacked LoRA weights (B block-diagonal) plus at most one gathered copy
    per plan: ~25 + 25 MB at L = 16 for the 30-layer 135M model.
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple] = {}
        self._units: dict[int, tuple] = {}
        self._nonzero: dict[int, tuple] = {}
        self.epoch = 0
        self.builds = 0

    def invalidate(self) -> None:
        """Drop every entry (slot contents changed)."""
        self._entries.clear()
        self._units.clear()
        self._nonzero.clear()
        self.epoch += 1

    def nonzero_slots(self, lora_a_stacked: Sequence[torch.Tensor],
                      lora_b_stacked: Sequence[torch.Tensor]) -> torch.Tensor:
        """(L,) bool: slot l can change the output, i.e. for some slice i both ``A_i[l]`` and
        ``B_i[l]`` are non-zero (an adapter targeting the layer sits there). Empty ``lora_a_stacked``
        (the embedding layer's LoRA, expand only) checks B alone. Cached like :meth:`get`.

        Args:
            lora_a_stacked: n tensors (L, ...) or none. lora_b_stacked: n tensors (L, ...).
        """
        first = lora_b_stacked[0]
        key = id(first)
        versions = self._versions((*lora_a_stacked, *lora_b_stacked))
        hit = self._nonzero.get(key)
        if hit is not None and hit[0]() is first and hit[1] == self.epoch and hit[2] == versions:
            return hit[3]

        def per_slot(t: torch.Tensor) -> torch.Tensor:  # (L,) bool
            return t.reshape(t.shape[0], -1).ne(0).any(dim=1)

        if lora_a_stacked:
            nz = torch.stack([per_slot(a) & per_slot(b) for a, b in zip(lora_a_stacked, lora_b_stacked)]).any(dim=0)
        else:
            nz = torch.stack([per_slot(b) for b in lora_b_stacked]).any(dim=0)
        self._nonzero[key] = (weakref.ref(first), self.epoch, versions, nz)
        return nz

    @staticmethod
    def _versions(tensors: Sequence[torch.Tensor]) -> tuple | None:
        try:
            return tuple(t._version for t in tensors)
        except RuntimeError:  # inference tensors have no version counter
            return None

    def get(self, lora_a_stacked: Sequence[torch.Tensor], lora_b_stacked: Sequence[torch.Tensor],
            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``build_slot_weights(lora_a_stacked, lora_b_stacked, dtype)``, cached."""
        entry = self._entry(lora_a_stacked, lora_b_stacked, dtype)
        return entry[4], entry[5]

    def is_zero(self, lora_a_stacked: Sequence[torch.Tensor], lora_b_stacked: Sequence[torch.Tensor],
                dtype: torch.dtype) -> bool:
        """True when every slot of the layer is zero (no loaded adapter targets it: skip it).

        vLLM wraps every supported linear layer (also gate/up/down when adapters only target
        q/k/v/o) and runs the LoRA ops on their all-zero slots; skipping them halves the work.
        """
        return self._entry(lora_a_stacked, lora_b_stacked, dtype)[6]

    def _entry(self, lora_a_stacked, lora_b_stacked, dtype) -> tuple:
        key = id(lora_a_stacked[0])
        versions = self._versions((*lora_a_stacked, *lora_b_stacked))
        hit = self._entries.get(key)
        if hit is not None:
            ref, epoch, vers, hdtype = hit[:4]
            if ref() is lora_a_stacked[0] and epoch == self.epoch and vers == versions and hdtype == dtype:
                return hit
        a_slot, b_slot = build_slot_weights(lora_a_stacked, lora_b_stacked, dtype)
        zero = not (bool(a_slot.any()) and bool(b_slot.any()))
        entry = (weakref.ref(lora_a_stacked[0]), self.epoch, versions, dtype, a_slot, b_slot, zero)
        self._entries[key] = entry
        self._units.pop(key, None)
        self.builds += 1
        return entry

    def get_units(self, lora_a_stacked: Sequence[torch.Tensor], lora_b_stacked: Sequence[torch.Tensor],
                  dtype: torch.dtype, plan: "TokenPlan") -> tuple[torch.Tensor, torch.Tensor]:
        """``(A_slot, B_slot)`` rows for ``plan.units`` (views when the units are slots 0..U-1)."""
        a_slot, b_slot = self.get(lora_a_stacked, lora_b_stacked, dtype)
        if plan.units_are_prefix:
            return a_slot[:plan.units.shape[0]], b_slot[:plan.units.shape[0]]
        key = id(lora_a_stacked[0])
        hit = self._units.get(key)
        if hit is not None and hit[0] == plan.key and hit[1] is a_slot:
            return hit[2], hit[3]
        a_u, b_u = a_slot.index_select(0, plan.units), b_slot.index_select(0, plan.units)
        self._units[key] = (plan.key, a_slot, a_u, b_u)
        return a_u, b_u


_plan_counter = itertools.count()

# Cost of gathering one unit's weights (n*r x (in + sum o_i) values), in padded token rows; it
# steers the unit size of a sorted plan (:func:`plan_tokens`). Order of magnitude only.
UNIT_COST_ROWS = 64


@dataclass(frozen=True)
class TokenPlan:
    """How one batch's tokens are grouped for :func:`lora_linear` (built when the mapping changes).

    The batch is cut into U units of G token rows, every unit on one slot, and the units go
    through ``bmm`` together:

    * ``runs``: vLLM keeps each request's tokens together and an ESSA population's requests come
      as P groups of B, so a decode step is P runs of equal length; ``x`` is then viewed as
      (U, G, in) with no copy (``perm is None``);
    * ``sorted``: otherwise the tokens are sorted by slot (stable), every slot's group is cut
      into chunks of at most G rows, and ``x`` and the result are gathered through ``perm``/``inv``.

    Attributes:
        num_tokens: T.
        num_slots: L.
        mode: "none" (no token has an adapter) or "grouped".
        units: (U,) int64 slot of each unit (L = the all-zero "no adapter" slot).
        group_size: G, rows per unit (shorter units are padded).
        perm: (U*G,) int64 token row of each padded position (padding repeats row 0), or None when
            the units tile the tokens in order.
        inv: (T,) int64 padded position of each token, or None like ``perm``.
        units_are_prefix: ``units`` is 0..U-1 (unit weights are views, nothing gathered).
        key: unique id of this plan (keys the gathered unit weights).
    """

    num_tokens: int
    num_slots: int
    mode: str
    units: torch.Tensor | None = None
    group_size: int = 0
    perm: torch.Tensor | None = None
    inv: torch.Tensor | None = None
    units_are_prefix: bool = False
    key: int = field(default_factory=lambda: next(_plan_counter))


def _chunk_size(counts: list[int]) -> int:
    """Unit size G minimising padded rows + UNIT_COST_ROWS per unit over the groups' sizes."""
    top = max(counts)
    best, best_cost = top, None
    g = top
    while g >= 1:
        units = sum(-(-c // g) for c in counts)
        cost = units * g + UNIT_COST_ROWS * units
        if best_cost is None or cost < best_cost:
            best, best_cost = g, cost
        g //= 2
    return best


def plan_tokens(indices: torch.Tensor, num_slots: int, allow_runs: bool = True) -> TokenPlan:
    """Group a batch's tokens by slot for :func:`lora_linear`.

    ``runs`` (no copy) when the batch is a sequence of equal-length runs of one slot each, at most
    ``2 (L + 1)`` of them; ``sorted`` otherwise (see :class:`TokenPlan`).

    Args:
        indices: (T,) int64 slot per token, -1 = no adapter.
        num_slots: L.
        allow_runs: False forces the sorted layout (tests).
    """
    t = int(indices.shape[0])
    dev = indices.device
    no_lora = indices < 0
    if t == 0 or bool(no_lora.all()):
        return TokenPlan(t, num_slots, "none")
    slot = torch.where(no_lora, num_slots, indices)  # -1 -> the zero slot L
    run_slot, run_len = torch.unique_consecutive(slot, return_counts=True)
    n_runs = int(run_slot.shape[0])
    if allow_runs and n_runs <= 2 * (num_slots + 1) and bool((run_len == run_len[0]).all()):
        prefix = bool(torch.equal(run_slot, torch.arange(n_runs, device=dev)))
        return TokenPlan(t, num_slots, "grouped", run_slot, int(run_len[0]), units_are_prefix=prefix)
    n_groups = num_slots + 1
    counts = torch.bincount(slot, minlength=n_groups)
    g = _chunk_size([c for c in counts.tolist() if c])
    chunks = (counts + g - 1) // g  # units per slot
    first_unit = torch.cumsum(chunks, 0) - chunks
    order = torch.argsort(slot, stable=True)
    rank = torch.empty_like(slot)
    rank[order] = torch.arange(t, device=dev) - (torch.cumsum(counts, 0) - counts)[slot[order]]
    unit = first_unit[slot] + rank // g  # (T,) unit of each token
    units = torch.repeat_interleave(torch.arange(n_groups, device=dev), chunks)
    n_units = int(units.shape[0])
    inv = unit * g + rank % g
    perm = torch.zeros(n_units * g, dtype=torch.long, device=dev)
    perm[inv] = torch.arange(t, device=dev)
    prefix = bool(torch.equal(units, torch.arange(n_units, device=dev)))
    return TokenPlan(t, num_slots, "grouped", units, g, perm, inv, units_are_prefix=prefix)


def lora_linear(y: torch.Tensor, x: torch.Tensor, a_slot: torch.Tensor, b_slot: torch.Tensor,
                plan: TokenPlan, scale: float = 1.0, offset_start: int = 0,
                unit_weights: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Fused multi-LoRA delta of one (possibly packed) linear layer, in place.

    Semantics (n slices, e.g. q/k/v packed into one output)::

        off = offset_start
        for i in range(n):
            for t in range(T):
                if idx[t] >= 0:
                    y[t, off:off+o_i] += scale * x[t] @ A_i[idx[t]].T @ B_i[idx[t]].T
            off += o_i

    as ``S = bmm(x_units, A_unit^T)`` then ``y_units.baddbmm_(S, B_unit)``: two ops when the plan
    needs no gather (an ESSA decode step), five otherwise (gather x and y rows, scatter y back).
    S is rounded to ``x``'s dtype (as vLLM's reference rounds its fp32 shrink result before the
    expand); ``y + S @ B`` is rounded once. Every token takes the same arithmetic whatever the
    batch and layout around it (rows of bf16 ``bmm``/``baddbmm`` do not depend on the batch
    size), so greedy outputs do not depend on how vLLM happened to schedule the requests.

    Args:
        y: (T, >= offset_start + sum(o_i)) layer output, updated in place.
        x: (T, in) layer input; the GEMMs run in ``x``'s dtype.
        a_slot, b_slot: from :func:`build_slot_weights` (dtype of ``x``).
        plan: from :func:`plan_tokens` for this batch's slot ids.
        scale: multiplies the delta.
        unit_weights: ``(a_slot[plan.units], b_slot[plan.units])`` if already gathered (cache).

    Raises:
        ValueError: shapes disagree.
    """
    t, d_in = x.shape
    if t != plan.num_tokens or a_slot.shape[0] != plan.num_slots + 1:
        raise ValueError(f"x has {t} rows and weights {a_slot.shape[0] - 1} slots but the plan is for "
                         f"{plan.num_tokens} tokens and {plan.num_slots} slots")
    if plan.mode == "none":
        return
    width = b_slot.shape[2]
    out = y if (offset_start == 0 and y.shape[1] == width) else y[:, offset_start:offset_start + width]
    u, g = plan.units.shape[0], plan.group_size
    if unit_weights is None:
        unit_weights = ((a_slot[:u], b_slot[:u]) if plan.units_are_prefix
                        else (a_slot.index_select(0, plan.units), b_slot.index_select(0, plan.units)))
    a_u, b_u = unit_weights
    s = torch.bmm(x.reshape(u, g, d_in) if plan.perm is None else x.index_select(0, plan.perm).view(u, g, d_in),
                  a_u.transpose(1, 2))  # (U, G, n*r)
    if scale != 1.0:
        s.mul_(scale)
    if plan.perm is None:
        out.unflatten(0, (u, g)).baddbmm_(s, b_u)  # y += S @ B_unit, (U, G, sum o_i), in place
        return
    yg = out.index_select(0, plan.perm).view(u, g, width)  # the same arithmetic on gathered rows
    yg.baddbmm_(s, b_u)
    rows = yg.view(u * g, width)
    if out.is_contiguous():
        torch.index_select(rows, 0, plan.inv, out=out)
    else:
        out.copy_(rows.index_select(0, plan.inv))
