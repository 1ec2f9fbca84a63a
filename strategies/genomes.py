"""Genome codecs: invertible maps between a genome vector (D,) and LoRA tensors.

A LoRA state is ``dict[str, torch.Tensor]`` in PEFT key format, float32 on CPU
(docs/ARCHITECTURE.md)::

    base_model.model.model.layers.{l}.self_attn.{m}.lora_A.weight   (r, in)
    base_model.model.model.layers.{l}.self_attn.{m}.lora_B.weight   (out, r)

with ``m`` in ``q_proj, k_proj, v_proj, o_proj`` and W' = W + (lora_alpha / r) B A.

Canonical key order (every codec, every slice table): layer index ascending (numerically,
so 2 before 10), then module q, k, v, o, then A before B.

Codecs:

* :class:`SVDLoRAGenome` - ESSA (arXiv 2507.04453, §3 step 2): the singular values of every
  factor, D = L x 4 x 2 x floor(alpha r). Searched by CMA-ES (``strategy=essa``).
* :class:`TinyLoRAGenome` - TinyLoRA (arXiv 2602.04118): u numbers tied across modules, through
  fixed random r x r projections in the SVD frame of the warm start's update, D = u (16 by default).
* :class:`LoRAGenome` - every entry of every A and B, D = sum of factor sizes. Searched by
  separable CMA-ES (``strategy=sep_cma``).

Both satisfy ``decode(x0()) == input adapter`` and ``encode(decode(x)) == x`` (to float
tolerance); :func:`make_genome` builds one from ``strategy.genome.kind``.
"""

from __future__ import annotations

import abc
import math
import re
import time
import warnings
from typing import Literal

import numpy as np
import torch

__all__ = [
    "MODULES",
    "GenomeCodec",
    "LoRAGenome",
    "SVDLoRAGenome",
    "TinyLoRAGenome",
    "benchmark_decode",
    "canonical_keys",
    "lora_key",
    "make_genome",
    "random_lora",
]

LoRAState = dict[str, torch.Tensor]

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
_KEY = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.self_attn\.(q_proj|k_proj|v_proj|o_proj)\.lora_(A|B)\.weight$"
)


def lora_key(layer: int, module: str, factor: Literal["A", "B"]) -> str:
    """PEFT key of one LoRA factor, e.g. ``lora_key(3, "q_proj", "A")``."""
    return f"base_model.model.model.layers.{layer}.self_attn.{module}.lora_{factor}.weight"


def canonical_keys(lora: LoRAState) -> list[str]:
    """Keys of ``lora`` in canonical order (layer, then q/k/v/o, then A before B).

    Raises:
        ValueError: on an empty state, a key outside the PEFT attention pattern, a module
            with only one of its two factors, a non-2-D tensor, A/B ranks that disagree, or
            ranks that differ between modules.
    """
    if not lora:
        raise ValueError("LoRA state is empty; pass the SFT adapter's tensors (engine.lora.files.read_adapter)")
    parsed = {}
    for key in lora:
        m = _KEY.match(key)
        if m is None:
            raise ValueError(
                f"LoRA key {key!r} is not "
                "'base_model.model.model.layers.{l}.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight'"
            )
        parsed[key] = (int(m.group(1)), MODULES.index(m.group(2)), m.group(3))
    keys = sorted(lora, key=lambda k: parsed[k])
    ranks = set()
    for key in keys:
        if lora[key].ndim != 2:
            raise ValueError(f"LoRA tensor {key!r} has shape {tuple(lora[key].shape)}; expected a 2-D matrix")
        layer, mod, factor = parsed[key]
        other = lora_key(layer, MODULES[mod], "B" if factor == "A" else "A")
        if other not in lora:
            raise ValueError(f"LoRA state has {key!r} but not {other!r}; every module needs both factors")
        if factor == "A":
            r_a, r_b = lora[key].shape[0], lora[other].shape[1]
            if r_a != r_b:
                raise ValueError(
                    f"LoRA rank mismatch at layer {layer} {MODULES[mod]}: A has {r_a} rows, B has {r_b} columns"
                )
            ranks.add(r_a)
    if len(ranks) != 1:
        raise ValueError(f"LoRA ranks differ between modules ({sorted(ranks)}); genome codecs need one rank r")
    return keys


class GenomeCodec(abc.ABC):
    """Invertible map genome (D,) float64 <-> LoRA state (dict of float32 CPU tensors).

    Args:
        lora: the reference (SFT) adapter; genome ``x0()`` (zeros) decodes to it.

    Attributes:
        keys: canonical key order (see module docstring).
        shapes: ``{key: (rows, cols)}``.
        rank: r.
        layers: sorted layer indices present (L = ``len(layers)``).

    Raises:
        ValueError: see :func:`canonical_keys`.
    """

    def __init__(self, lora: LoRAState) -> None:
        self.keys = canonical_keys(lora)
        self.shapes = {k: tuple(lora[k].shape) for k in self.keys}
        self.rank = int(lora[self.keys[0]].shape[0])
        self.layers = sorted({int(_KEY.match(k).group(1)) for k in self.keys})

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """D, the genome length."""

    @abc.abstractmethod
    def slices(self) -> list[tuple[str, int, int]]:
        """``[(key, start, stop)]`` in canonical order: genome[start:stop] belongs to key."""

    @abc.abstractmethod
    def decode_batch(self, genomes: np.ndarray) -> list[LoRAState]:
        """Decode (P, D) genomes into P LoRA states (each tensor owns its storage)."""

    @abc.abstractmethod
    def encode(self, lora: LoRAState) -> np.ndarray:
        """Genome (D,) float64 of a LoRA state with this codec's keys and shapes."""

    def decode(self, genome: np.ndarray) -> LoRAState:
        """Decode one genome (D,) into a LoRA state (float32 CPU tensors, canonical key order)."""
        genome = np.asarray(genome, dtype=np.float64)
        if genome.shape != (self.dim,):
            raise ValueError(f"genome has shape {genome.shape}, expected ({self.dim},) for {type(self).__name__}")
        return self.decode_batch(genome[None])[0]

    def decode_torch(self, genome: torch.Tensor) -> LoRAState:
        """:meth:`decode` in torch, differentiable in ``genome`` (D,) (the gradient oracle of
        tools/genome_capacity.py backpropagates through it): float32 factors on the genome's device.

        Raises:
            ValueError: a genome that is not (D,). NotImplementedError: a codec without a differentiable decode.
        """
        raise NotImplementedError(f"{type(self).__name__} has no differentiable decode_torch")

    def _check_torch(self, genome: torch.Tensor) -> torch.Tensor:
        if tuple(genome.shape) != (self.dim,):
            raise ValueError(f"genome has shape {tuple(genome.shape)}, expected ({self.dim},) for {type(self).__name__}")
        return genome

    def x0(self) -> np.ndarray:
        """The genome of the reference adapter: zeros, (D,) float64."""
        return np.zeros(self.dim)

    def _check_batch(self, genomes: np.ndarray) -> np.ndarray:
        genomes = np.asarray(genomes, dtype=np.float64)
        if genomes.ndim != 2 or genomes.shape[1] != self.dim:
            raise ValueError(f"genomes have shape {genomes.shape}, expected (P, {self.dim}) for {type(self).__name__}")
        if not np.all(np.isfinite(genomes)):
            raise ValueError("genomes contain NaN/inf; the strategy produced non-finite candidates")
        return genomes

    def _check_lora(self, lora: LoRAState) -> None:
        keys = canonical_keys(lora)
        if keys != self.keys or any(tuple(lora[k].shape) != self.shapes[k] for k in keys):
            raise ValueError(
                f"LoRA state does not match this {type(self).__name__}'s keys/shapes; "
                "encode adapters of the same model and rank"
            )


def searched_singular_values(alpha: float, rank: int) -> int:
    """k = floor(alpha r): the singular values searched per LoRA factor (ESSA §3.2); 0 means alpha
    is too small for the rank. The epsilon absorbs float error (0.29 * 100 = 28.999...)."""
    return math.floor(alpha * rank + 1e-9)


class SVDLoRAGenome(GenomeCodec):
    """ESSA's genome: offsets of the top singular values of every LoRA factor.

    ESSA (arXiv 2507.04453, §3 step 2) decomposes each factor separately (not B A):
    A = U_A diag(s_A) V_A^T, B = U_B diag(s_B) V_B^T (``torch.linalg.svd``,
    ``full_matrices=False``, float64). U and V are frozen; the genome holds offsets of the
    k = floor(alpha r) largest singular values of every factor, so D = L x 4 x 2 x k
    (for L layers with all four modules). Slice table (canonical order, k per factor)::

        genome[0   : k ]   layers.{l0}.q_proj.lora_A   offsets of s_A[0..k-1] (largest first)
        genome[k   : 2k]   layers.{l0}.q_proj.lora_B
        genome[2k  : 3k]   layers.{l0}.k_proj.lora_A
        ...
        genome[7k  : 8k]   layers.{l0}.o_proj.lora_B
        genome[8k  : 9k]   layers.{l1}.q_proj.lora_A   ... and so on for every layer

    Modes (s' is the decoded singular value, x the genome entry):

    * ``"additive"`` (the paper): s' = s + x.
    * ``"relative"``: s' = s (1 + x). Scale-free, so one CMA-ES sigma suits every factor;
      better conditioned when A's and B's singular values differ by orders of magnitude (after
      a short SFT, s_B is typically far below s_A). A zero singular value stays zero: its
      genome entries have no effect (a warning is issued at construction).

    Zero singular values (e.g. B = 0, ESSA without SFT): LAPACK returns coordinate axes as the
    singular vectors of a zero matrix, which would confine the search to the first r output
    coordinates. The singular vectors of every (numerically) zero singular value are therefore
    replaced by a random orthonormal completion of the others, seeded by ``basis_seed`` and the
    factor's position, so decode stays well defined and deterministic (additive mode moves
    along this frozen basis). Zero singular values contribute nothing, so decode(x0) is exact.

    Args:
        lora: the reference (SFT) adapter, see :class:`GenomeCodec`.
        alpha: fraction of the rank searched, 0 < alpha <= 1; k = floor(alpha r) >= 1.
        mode: ``"additive"`` or ``"relative"``.
        basis_seed: seed of the random completion of null singular vectors.

    Raises:
        ValueError: on a bad alpha (naming ``strategy.genome.alpha``) or mode (naming
            ``strategy.genome.mode``), or r > min(in, out); see also :func:`canonical_keys`.
    """

    def __init__(
        self,
        lora: LoRAState,
        alpha: float = 1.0,
        mode: Literal["additive", "relative"] = "additive",
        basis_seed: int = 0,
    ) -> None:
        super().__init__(lora)
        if mode not in ("additive", "relative"):
            raise ValueError(f"strategy.genome.mode must be 'additive' or 'relative' (got {mode!r})")
        if not (0 < alpha <= 1):
            raise ValueError(f"strategy.genome.alpha must be in (0, 1] (got {alpha!r})")
        k = searched_singular_values(alpha, self.rank)
        if k < 1:
            raise ValueError(
                f"strategy.genome.alpha={alpha} gives floor(alpha * r) = {k} singular values at rank r={self.rank}; "
                f"use alpha >= {1 / self.rank:.3g}"
            )
        self.alpha, self.mode, self.k, self.basis_seed = float(alpha), mode, k, int(basis_seed)
        us, ss, vhs, zero_top = self._decompose(lora)
        if mode == "relative" and zero_top:
            warnings.warn(
                f"SVDLoRAGenome(mode='relative'): {zero_top} of the searched singular values are zero (e.g. B = 0 "
                "without SFT); their genome entries have no effect - use mode='additive' or run SFT first",
                stacklevel=2,
            )
        self.s = np.stack(ss)  # (F, r) float64, F = number of factors, canonical order
        # group factors of equal shape (e.g. all q_proj A's) so decode_batch is a few batched matmuls
        self._groups = []
        by_shape: dict[tuple[int, int], list[int]] = {}
        for i, key in enumerate(self.keys):
            by_shape.setdefault(self.shapes[key], []).append(i)
        for shape, idx in by_shape.items():
            self._groups.append(
                (
                    np.array(idx),
                    torch.from_numpy(np.stack([us[i] for i in idx])).to(torch.float32),  # (G, m, r)
                    torch.from_numpy(np.stack([vhs[i] for i in idx])).to(torch.float32),  # (G, r, n)
                    shape[0] <= shape[1],  # True: U @ (s Vh) (A factors); False: (U s) @ Vh (B factors)
                )
            )
        self._u = us
        self._vh = vhs

    def _decompose(self, lora: LoRAState) -> tuple[list, list, list, int]:
        """SVD of every factor in canonical order: (U (m, r) list, s (r,) list, Vh (r, n) list, the number
        of searched singular values that are zero). A zero singular value's singular vectors are
        completed to an orthonormal basis from a stream seeded by (basis_seed, factor index)."""
        r, k = self.rank, self.k
        us, ss, vhs = [], [], []
        zero_top = 0
        for i, key in enumerate(self.keys):
            w = lora[key].detach().to("cpu", torch.float64)
            if r > min(w.shape):
                raise ValueError(f"LoRA rank r={r} exceeds min{tuple(w.shape)} of {key!r}")
            u, s, vh = torch.linalg.svd(w, full_matrices=False)  # (m, r), (r,), (r, n)
            u, s, vh = u.numpy(), s.numpy().copy(), vh.numpy()
            null = s <= max(w.shape) * np.finfo(np.float64).eps * max(s[0], 1e-300)
            if null.any():
                s[null] = 0.0
                rng = np.random.default_rng([self.basis_seed, i])
                u = _complete_basis(u[:, ~null], r, rng)
                vh = _complete_basis(vh[~null].T, r, rng).T
                zero_top += int(null[:k].sum())
            us.append(u)
            ss.append(s)
            vhs.append(vh)
        return us, ss, vhs, zero_top

    @property
    def dim(self) -> int:
        """D = (number of factors) x k = L x 4 x 2 x floor(alpha r) for full attention LoRA."""
        return len(self.keys) * self.k

    def slices(self) -> list[tuple[str, int, int]]:
        """``[(key, i k, (i + 1) k)]`` for the i-th factor in canonical order."""
        return [(key, i * self.k, (i + 1) * self.k) for i, key in enumerate(self.keys)]

    def singular_values(self, genomes: np.ndarray) -> np.ndarray:
        """Decoded singular values s' of every factor.

        Args:
            genomes: (P, D).

        Returns:
            (P, F, r) float64, F factors in canonical order; entries k..r-1 are frozen.
        """
        genomes = self._check_batch(genomes)
        return self.apply_offsets(genomes.reshape(len(genomes), len(self.keys), self.k))

    def apply_offsets(self, offsets: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """Singular values s' from genome offsets: s_top + x (additive) or s_top (1 + x) (relative).

        Args:
            offsets: (..., F, k) float64, a numpy array or a torch tensor (differentiable in it).

        Returns:
            (..., F, r) float64 of the same type; entries k..r-1 are the frozen reference values.

        Raises:
            ValueError: when the last two dimensions are not (F, k).
        """
        if tuple(offsets.shape[-2:]) != (len(self.keys), self.k):
            raise ValueError(f"genome offsets of shape {tuple(offsets.shape)}: expected (..., {len(self.keys)}, "
                             f"{self.k}) (factors, searched singular values each)")
        if isinstance(offsets, torch.Tensor):
            ref = torch.from_numpy(self.s).to(offsets.device).expand(*offsets.shape[:-1], -1)
            cat = torch.cat
        else:
            ref = np.broadcast_to(self.s, (*offsets.shape[:-1], self.s.shape[1]))
            cat = np.concatenate
        top = ref[..., : self.k]
        top = top + offsets if self.mode == "additive" else top * (1.0 + offsets)
        return cat([top, ref[..., self.k:]], -1)

    def compose(self, s: torch.Tensor) -> list[LoRAState]:
        """LoRA factors W' = U diag(s') V^T on the frozen bases, differentiable in s' (the gradient
        oracle of tools/genome_capacity.py backpropagates through it).

        Args:
            s: (P, F, r) singular values (:meth:`apply_offsets`), on any device; the products run in
                float32 (the adapter's dtype).

        Returns:
            P dicts {PEFT key: (rows, cols) float32 on s's device} in canonical key order; the tensors
            are views of one batched product per factor shape.
        """
        s = s.to(torch.float32)
        out: list[LoRAState] = [{} for _ in range(len(s))]
        for idx, u, vh, scale_right in self._groups:
            u, vh = u.to(s.device), vh.to(s.device)
            sg = s[:, torch.from_numpy(idx).to(s.device)]  # (P, G, r)
            if scale_right:
                w = u @ (sg[..., None] * vh)  # (G, m, r) @ (P, G, r, n) -> (P, G, m, n)
            else:
                w = (u * sg[:, :, None, :]) @ vh  # (P, G, m, r) @ (G, r, n) -> (P, G, m, n)
            keys = [self.keys[i] for i in idx]
            for d, wp in zip(out, w.unbind(0)):
                d.update(zip(keys, wp.unbind(0)))
        return [{key: d[key] for key in self.keys} for d in out]

    def decode_torch(self, genome: torch.Tensor) -> LoRAState:
        """Differentiable decode of one genome (D,): the offsets in float64, the products in float32
        (:meth:`apply_offsets`, :meth:`compose`), as :meth:`decode_batch` does them."""
        offsets = self._check_torch(genome).to(torch.float64).view(len(self.keys), self.k)
        return self.compose(self.apply_offsets(offsets)[None])[0]

    def decode_batch(self, genomes: np.ndarray) -> list[LoRAState]:
        """Decode genomes into LoRA states: W' = U diag(s') V^T per factor.

        Args:
            genomes: (P, D) float.

        Returns:
            P dicts in canonical key order of float32 CPU tensors with the input adapter's
            shapes; each tensor owns its storage (safetensors refuses shared storage).

        Raises:
            ValueError: on a wrong shape or non-finite entries.
        """
        # offsets are applied in float64, the products run in float32 (the adapter's dtype; 3x faster)
        s = torch.from_numpy(self.singular_values(genomes))  # (P, F, r) float64
        return [{key: w.clone() for key, w in d.items()} for d in self.compose(s)]

    def encode(self, lora: LoRAState) -> np.ndarray:
        """Genome of ``lora``: s' = diag(U^T W V) on the frozen bases, then the offsets.

        Exact for adapters in the codec's image (the outputs of :meth:`decode`); any other
        adapter is projected onto the frozen bases. In relative mode an entry whose reference
        singular value is zero encodes as 0.

        Returns:
            (D,) float64.

        Raises:
            ValueError: if ``lora``'s keys or shapes differ from the reference adapter's.
        """
        self._check_lora(lora)
        genome = np.empty((len(self.keys), self.k))
        for i, key in enumerate(self.keys):
            w = lora[key].detach().to("cpu", torch.float64).numpy()
            s_new = np.einsum("mr,mn,rn->r", self._u[i][:, : self.k], w, self._vh[i][: self.k])
            s_ref = self.s[i, : self.k]
            if self.mode == "additive":
                genome[i] = s_new - s_ref
            else:
                safe = np.where(s_ref > 0, s_ref, 1.0)
                genome[i] = np.where(s_ref > 0, s_new / safe - 1.0, 0.0)
        return genome.reshape(-1)


class LoRAGenome(GenomeCodec):
    """Every entry of every LoRA factor: genome = offsets added to the reference entries.

    D = sum over factors of rows x cols (e.g. 921,600 for a 30-layer rank-8 model with
    hidden 576 and k/v width 192), so search it with separable CMA-ES (``sep_cma``).
    Slice table: factor after factor in canonical order, each flattened row-major
    (``tensor.reshape(-1)``); ``slices()`` lists the bounds.

    Args:
        lora: the reference (SFT) adapter.

    Raises:
        ValueError: see :func:`canonical_keys`.
    """

    def __init__(self, lora: LoRAState) -> None:
        super().__init__(lora)
        sizes = [math.prod(self.shapes[k]) for k in self.keys]
        self._bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        self.base = np.concatenate([lora[k].detach().to("cpu", torch.float64).reshape(-1).numpy() for k in self.keys])

    @property
    def dim(self) -> int:
        """D = total number of LoRA entries."""
        return int(self._bounds[-1])

    def slices(self) -> list[tuple[str, int, int]]:
        """``[(key, start, stop)]``; genome[start:stop] is the row-major offset of key."""
        return [(k, int(a), int(b)) for k, a, b in zip(self.keys, self._bounds[:-1], self._bounds[1:])]

    def decode_batch(self, genomes: np.ndarray) -> list[LoRAState]:
        """Decode (P, D) genomes into P LoRA states (float32 CPU, canonical order, own storage).

        Raises:
            ValueError: on a wrong shape or non-finite entries.
        """
        w = torch.from_numpy((self._check_batch(genomes) + self.base).astype(np.float32))  # (P, D)
        return [{k: w[p, a:b].reshape(self.shapes[k]).clone() for k, a, b in self.slices()} for p in range(len(w))]

    def decode_torch(self, genome: torch.Tensor) -> LoRAState:
        """Differentiable decode of one genome (D,): the reference entries plus the offsets, float32."""
        w = (torch.from_numpy(self.base).to(genome.device) + self._check_torch(genome).to(torch.float64)).to(torch.float32)
        return {k: w[a:b].view(self.shapes[k]) for k, a, b in self.slices()}

    def encode(self, lora: LoRAState) -> np.ndarray:
        """Entry-wise offset from the reference adapter, (D,) float64.

        Raises:
            ValueError: if ``lora``'s keys or shapes differ from the reference adapter's.
        """
        self._check_lora(lora)
        flat = np.concatenate([lora[k].detach().to("cpu", torch.float64).reshape(-1).numpy() for k in self.keys])
        return flat - self.base


class TinyLoRAGenome(GenomeCodec):
    """TinyLoRA's genome (arXiv 2602.04118, §3; LoRA-XS's SVD frame): u numbers, tied across modules,
    mapped through fixed random r x r projections into every module's warm-start update.

    The paper (and ``peft.TinyLoraConfig``) writes a module's update as U sqrt(S) R sqrt(S) V^T with
    U, S, V the top-r SVD of the frozen *base* weight and R = sum_i v_i P_i. Here the frame is the warm
    start's own update B A = U S V^T (rank r, the adapter's rank), so the result stays an ordinary LoRA
    adapter of the warm start's rank that vLLM serves like any other (the base weight's frame would
    need rank r + r_tiny adapters and a larger ``max_lora_rank``). Only B moves; A is kept::

        R_m   = sum_i v_{g(m), i} P_{m, i}                 # (r, r); P_m (u, r, r) ~ N(0, 1 / (r u))
        B'_m  = B_m + U_m sqrt(S_m) R_m sqrt(S_m) V_m^T A_m^+     # (out, r)
        B'_m A_m = B_m A_m + U_m sqrt(S_m) R_m sqrt(S_m) V_m^T    # V^T lies in A's row space

    so v = 0 decodes to the warm start exactly and R = I would double a module's update. ``P`` has
    peft's N(0, 1/r) entries divided by sqrt(u), so that a genome v ~ N(0, sigma^2 I_u) gives R entries
    of std sigma / sqrt(r) at every u: one ``strategy.sigma0`` means the same relative change at any u.
    ``tied`` (the paper's full weight tying): one v for every module, D = u; untied, one v per module,
    D = u x modules. A module whose update is zero (B = 0, no warm start) has S = 0 and does not move.

    Args:
        lora: the reference (SFT) adapter, see :class:`GenomeCodec`.
        u: numbers per v, >= 1 (the paper: 1-13 on Qwen2.5-7B; peft's default 64).
        tied: one v for all modules (True) or one per module.
        projection_seed: seed of the P tensors (module m draws from the stream (seed, m)).

    Raises:
        ValueError: ``u`` not a positive integer (naming ``strategy.genome.u``), ``tied`` not a bool
            (naming ``strategy.genome.tied``), ``projection_seed`` not an integer >= 0; see also
            :func:`canonical_keys`.

    Warns:
        UserWarning: every module's update is zero (no warm start: nothing moves), or u exceeds the r^2
            entries of R one vector feeds (untied; tied: r^2 x modules), so some genome directions move nothing.
    """

    def __init__(self, lora: LoRAState, u: int = 16, tied: bool = True, projection_seed: int = 0) -> None:
        super().__init__(lora)
        if isinstance(u, bool) or not isinstance(u, (int, np.integer)) or u < 1:
            raise ValueError(f"strategy.genome.u must be an integer >= 1 (got {u!r}), e.g. strategy.genome.u=16")
        if not isinstance(tied, (bool, np.bool_)):
            raise ValueError(f"strategy.genome.tied must be true or false (got {tied!r})")
        if isinstance(projection_seed, bool) or not isinstance(projection_seed, (int, np.integer)) or projection_seed < 0:
            raise ValueError(f"TinyLoRAGenome: projection_seed must be an integer >= 0 (got {projection_seed!r})")
        self.u, self.tied, self.projection_seed = int(u), bool(tied), int(projection_seed)
        self.a_keys, self.b_keys = self.keys[0::2], self.keys[1::2]  # canonical order: A before B per module
        self._a = [lora[k].detach().to("cpu", torch.float32).clone() for k in self.a_keys]
        self._groups = []  # modules of one B shape: (module idx, B (G, out, r), L (G, out, r), Q (G, r, r), P (G, u, r, r))
        by_shape: dict[tuple[int, int], list[int]] = {}
        for m, key in enumerate(self.b_keys):
            by_shape.setdefault(self.shapes[key], []).append(m)
        for idx in by_shape.values():
            parts = [self._frame(lora, m) for m in idx]
            self._groups.append((np.array(idx), *(torch.stack(t) for t in zip(*parts))))
        self._warn_dead_directions()

    def _warn_dead_directions(self) -> None:
        """Warn where genome entries cannot all move the adapter: every update zero (no warm start), or u
        above the r^2 entries of R that one vector feeds (per module untied, all modules' tied)."""
        if not any(bool(left.any()) for _, _, left, _, _ in self._groups):
            warnings.warn("TinyLoRAGenome: every module's warm-start update B A is zero (no SFT), so no genome moves "
                          "the adapter; run the warm start first or use SVDLoRAGenome(mode='additive')", stacklevel=3)
        reach = self.rank ** 2 * (len(self.b_keys) if self.tied else 1)
        if self.u > reach:
            warnings.warn(f"TinyLoRAGenome: u={self.u} exceeds the {reach} entries of R it feeds "
                          f"({'all modules' if self.tied else 'per module'}, r={self.rank}); {self.u - reach} genome "
                          "directions per vector do not move the adapter, so encode(decode(x)) need not return x",
                          stacklevel=3)

    def _frame(self, lora: LoRAState, m: int) -> tuple[torch.Tensor, ...]:
        """Module m's B (out, r), L = U sqrt(S) (out, r), Q = sqrt(S) V^T A^+ (r, r) and P (u, r, r), float32."""
        a = lora[self.a_keys[m]].detach().to("cpu", torch.float64)  # (r, in)
        b = lora[self.b_keys[m]].detach().to("cpu", torch.float64)  # (out, r)
        q, tri = torch.linalg.qr(a.T)  # A^T = q tri: (in, r), (r, r); B A = (B tri^T) q^T
        u_, s, wh = torch.linalg.svd(b @ tri.T, full_matrices=False)  # (out, r), (r,), (r, r); V^T = wh q^T
        root = s.sqrt()
        left = u_ * root  # (out, r)
        right = root[:, None] * wh @ torch.linalg.pinv(tri.T)  # sqrt(S) V^T A^+ = sqrt(S) wh tri^-T: (r, r)
        r = self.rank
        g = torch.Generator().manual_seed(int(np.random.SeedSequence([self.projection_seed, m]).generate_state(1)[0]))
        p = torch.randn(self.u, r, r, generator=g, dtype=torch.float64) / math.sqrt(r * self.u)
        return tuple(t.to(torch.float32) for t in (b, left, right, p))

    @property
    def dim(self) -> int:
        """D = u (tied) or u x modules."""
        return self.u if self.tied else self.u * len(self.b_keys)

    def slices(self) -> list[tuple[str, int, int]]:
        """Tied: ``[("*", 0, u)]`` (one v moves every lora_B); untied: ``[(B key of module m, m u, (m + 1) u)]``."""
        if self.tied:
            return [("*", 0, self.u)]
        return [(key, m * self.u, (m + 1) * self.u) for m, key in enumerate(self.b_keys)]

    def compose(self, v: torch.Tensor) -> list[LoRAState]:
        """LoRA factors of genomes ``v`` (P, D), differentiable in v (float32 products on any device).

        Returns:
            P dicts {PEFT key: (rows, cols) float32 on v's device} in canonical key order; A tensors are
            the warm start's (shared across the P dicts), B tensors views of one product per shape.
        """
        v = v.to(torch.float32)
        per_module = v[:, None, :].expand(-1, len(self.b_keys), -1) if self.tied else v.view(len(v), -1, self.u)
        out: list[LoRAState] = [{} for _ in range(len(v))]
        for idx, b, left, right, p in self._groups:
            b, left, right, p = (t.to(v.device) for t in (b, left, right, p))
            r_mat = torch.einsum("pgu,guij->pgij", per_module[:, torch.from_numpy(idx).to(v.device)], p)
            new_b = b + left @ r_mat @ right  # (G, out, r) + (G, out, r) @ (P, G, r, r) @ (G, r, r) -> (P, G, out, r)
            for d, bp in zip(out, new_b.unbind(0)):
                d.update((self.b_keys[m], t) for m, t in zip(idx, bp.unbind(0)))
        a = {k: t.to(v.device) for k, t in zip(self.a_keys, self._a)}
        return [{key: (a[key] if key in a else d[key]) for key in self.keys} for d in out]

    def decode_torch(self, genome: torch.Tensor) -> LoRAState:
        """Differentiable decode of one genome (D,) (:meth:`compose`)."""
        return self.compose(self._check_torch(genome)[None])[0]

    def decode_batch(self, genomes: np.ndarray) -> list[LoRAState]:
        """Decode (P, D) genomes into P LoRA states (float32 CPU, canonical order, own storage).

        Raises:
            ValueError: on a wrong shape or non-finite entries.
        """
        with torch.no_grad():
            states = self.compose(torch.from_numpy(self._check_batch(genomes)))
        return [{key: w.clone() for key, w in d.items()} for d in states]

    def encode(self, lora: LoRAState) -> np.ndarray:
        """Least-squares v whose decoded B factors are nearest ``lora``'s (A is the warm start's).

        Exact for adapters in the codec's image (the outputs of :meth:`decode`) while u <= r^2 per vector
        (beyond that several genomes decode alike and the minimum-norm one is returned); any other adapter is
        projected. Returns (D,) float64.

        Raises:
            ValueError: if ``lora``'s keys or shapes differ from the reference adapter's.
        """
        self._check_lora(lora)
        gram = np.zeros((len(self.b_keys), self.u, self.u))  # (modules, u, u)
        rhs = np.zeros((len(self.b_keys), self.u))
        for idx, b, left, right, p in self._groups:
            basis = left.double()[:, None] @ p.double() @ right.double()[:, None]  # (G, u, out, r)
            target = torch.stack([lora[self.b_keys[m]].detach().to("cpu", torch.float64) for m in idx]) - b.double()
            gram[idx] = torch.einsum("guxy,gvxy->guv", basis, basis).numpy()
            rhs[idx] = torch.einsum("guxy,gxy->gu", basis, target).numpy()
        if self.tied:
            return np.linalg.lstsq(gram.sum(0), rhs.sum(0), rcond=None)[0]
        return np.concatenate([np.linalg.lstsq(g, h, rcond=None)[0] for g, h in zip(gram, rhs)])


def _complete_basis(q: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Orthonormal (m, n) matrix whose first columns are ``q`` (m, j), the rest random."""
    m, j = q.shape
    g = rng.standard_normal((m, n - j))
    qq, rr = np.linalg.qr(np.concatenate([q, g], axis=1))
    qq = qq * np.sign(np.where(np.diag(rr) == 0, 1.0, np.diag(rr)))  # keep q's columns, not -q
    return qq


def make_genome(kind: str, lora: LoRAState, **kwargs) -> GenomeCodec:
    """Build the codec named by ``strategy.genome.kind``.

    Args:
        kind: ``"svd_lora"`` (:class:`SVDLoRAGenome`, ESSA; kwargs ``alpha``, ``mode``,
            ``basis_seed``), ``"tinylora"`` (:class:`TinyLoRAGenome`; kwargs ``u``, ``tied``,
            ``projection_seed``) or ``"lora"`` (:class:`LoRAGenome`, no kwargs).
        lora: the reference (SFT) adapter.

    Raises:
        ValueError: on an unknown kind (one line naming ``strategy.genome.kind``).
    """
    if kind == "svd_lora":
        return SVDLoRAGenome(lora, **kwargs)
    if kind == "tinylora":
        return TinyLoRAGenome(lora, **kwargs)
    if kind == "lora":
        return LoRAGenome(lora, **kwargs)
    raise ValueError(f"strategy.genome.kind must be 'svd_lora', 'tinylora' or 'lora' (got {kind!r})")


def random_lora(
    num_layers: int = 30,
    rank: int = 8,
    hidden: int = 576,
    kv_dim: int = 192,
    seed: int = 0,
    zero_b: bool = False,
) -> LoRAState:
    """A random LoRA state for tests and benchmarks (shapes of a SmolLM2-135M-like model).

    A ~ PEFT's Kaiming-uniform init (entries U(-1/sqrt(in), 1/sqrt(in))); B ~ N(0, 0.01^2),
    the scale after a short SFT, or zeros with ``zero_b`` (PEFT's init, ESSA without SFT).
    q/o: (r, hidden)/(hidden, r); k/v: A (r, hidden), B (kv_dim, r).

    Returns:
        dict of float32 CPU tensors in canonical key order.
    """
    g = torch.Generator().manual_seed(seed)
    out = {}
    for layer in range(num_layers):
        for module in MODULES:
            width = kv_dim if module in ("k_proj", "v_proj") else hidden
            bound = 1.0 / math.sqrt(hidden)
            out[lora_key(layer, module, "A")] = (torch.rand(rank, hidden, generator=g) * 2 - 1) * bound
            b = torch.zeros(width, rank) if zero_b else 0.01 * torch.randn(width, rank, generator=g)
            out[lora_key(layer, module, "B")] = b
    return out


def benchmark_decode(population_size: int = 16, repeats: int = 3, **lora_kwargs) -> dict[str, float]:
    """Time :meth:`SVDLoRAGenome.decode_batch` and :meth:`LoRAGenome.decode_batch` on this CPU.

    Args:
        population_size: P.
        repeats: the best of this many runs is reported.
        **lora_kwargs: passed to :func:`random_lora` (default 30 layers, rank 8, 576/192).

    Returns:
        ``{"svd_lora_dim", "svd_lora_s", "lora_dim", "lora_s"}``: D and seconds per batch of P
        (also printed).
    """
    lora = random_lora(**lora_kwargs)
    result = {}
    for name, codec in (("svd_lora", SVDLoRAGenome(lora)), ("lora", LoRAGenome(lora))):
        x = np.random.default_rng(0).standard_normal((population_size, codec.dim)) * 1e-3
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            codec.decode_batch(x)
            best = min(best, time.perf_counter() - t0)
        result[f"{name}_dim"], result[f"{name}_s"] = codec.dim, best
        print(f"decode_batch {name}: P={population_size} D={codec.dim} {best * 1e3:.1f} ms")
    return result


if __name__ == "__main__":
    benchmark_decode()
