"""CMA-ES through pycma: the search strategy of ESSA (arXiv 2507.04453, §3, step 3).

ESSA runs standard (full-covariance, non-elitist) CMA-ES over the SVD-LoRA genome; the maths
is Hansen, "The CMA Evolution Strategy: A Tutorial" (arXiv 1604.00772, 2016) and the
implementation is pycma (``cma.CMAEvolutionStrategy``). Separable CMA-ES (Ros & Hansen 2008,
pycma option ``CMA_diagonal``) learns only the diagonal of C: linear time and memory, the
choice for large D (full CMA is impractical above ~10k dimensions).

pycma minimises; this adapter negates fitness and is the only place that does.

Memory and checkpoints (issue 16): full-covariance pycma keeps C and its eigenbasis B, 2 x D^2
float64, and the run loop checkpoints the strategy state after every generation. Measured with
``python tools/bench_checkpoint.py`` (Intel Xeon with AVX-512 BF16/AMX, 2 cores, shared and loaded):
D 1920 full 60 MB, 0.34 s to write (fsync'ed), 0.19 s to read; D 3584 full 207 MB, 1.3 s / 1.1 s;
separable 1-2 MB and 0.02 s at both. A generation takes ~15-60 s there and everything outside
generation should stay within 5 % of it (0.75 s of the shortest), so ``diagonal="auto"`` (the
default, and ``strategy=essa``'s) keeps full covariance up to ``AUTO_DIAGONAL_DIM`` = 2000 (ESSA's
D 1920 for SmolLM2-135M at rank 8) and runs separable CMA-ES above it. An explicit
``diagonal=False`` above ``MAX_FULL_DIM`` (8192: C and B alone are 1.07 GB, rewritten every
generation) is refused; a 7B model at rank 64 (D 14,336, C alone 1.6 GB) must be separable or use a
smaller genome (``strategy.genome.alpha``).

Exact resume: pycma samples through its ``randn`` option, by default numpy's *global*
generator. We hand it :class:`_GeneratorRandn`, a callable bound to the strategy's own
``np.random.Generator`` (``self.rng``, seeded from ``seed``); the base class saves that
generator's ``bit_generator.state`` and the adapter saves pycma's object pickled (:func:`dumps_es`),
so a restored strategy samples exactly what the original would have. That pickle names pycma's and
numpy's classes only: the sampler goes in as a persistent id (``pickle``'s hook for objects kept
outside the file) and comes back bound to the restored generator, so moving or renaming this
module cannot break a checkpoint. Checkpoints written before 2026-12 name
``strategies.cma_es._GeneratorRandn`` inside pycma's pickle; :data:`LEGACY_CLASSES` maps that path
on load without importing it.

Ties (``strategy.options.ties``, default ``"average"``): with k/N accuracies most candidates tie,
and pycma ranks by ``np.argsort``, so tied candidates got unequal recombination weights by their
place in the ask order: noise in every update (measured with pycma 4.5.0, D 4, popsize 8, sigma
0.3, all eight tied at 0.5: the mean moved 0.37 rms, a full selected step sigma sqrt(D / mueff)).
pycma's ``tell`` applies one sorted weight list ``sp.weights`` (Hansen 2016, arXiv 1604.00772,
eq. 49-53): ``positive_weights`` (the first ``mu``, summing to 1) to the mean, ``mean = sum_i w_i
x_i:lambda`` (eq. 41, absolute form), and all of them, negative (active) ones included, to the
rank-mu covariance update and, when separable, to the diagonal. For one tell the adapter swaps
in a copy whose weights are averaged over each run of tied ranks (:func:`tie_weights`), then
puts pycma's own list back, so the checkpointed state is pycma's and resumes exactly.

The boundary between positive and negative weights: a tied group that straddles it (some of its
ranks < mu, some >= mu) gives each member the group's positive mass divided by its size, and its
negative weights are dropped. Averaging them in instead would give that group one mixed weight;
if negative, pycma's absolute-form mean would see positive weights summing below 1 and pull the
mean toward the origin (all candidates tied: every weight negative, no mean at all); if positive,
smaller than its share of the mean. With the rule chosen the mean weights still sum to 1 and
equal the average of pycma's mean update over every order of the tied candidates (a random
tie-break, Rao-Blackwellised); dropping negative weight only lowers sum |w-|, so pycma's bound
for a positive-definite C (``finalize_negative_weights``) still holds, and C decays by cmu times
the dropped mass, as non-active CMA-ES does. Groups wholly on one side get the plain average
(sums preserved). ``mueff``, and with it every learning rate, stays pycma's; a tie-averaged mean
step is shorter than the paths expect (variance sum w^2 <= 1 / mueff), so generations full of
ties shrink sigma a little (all tied: E||dm||^2 falls from sigma^2 D / mueff to sigma^2 D / P).
No ties: pycma's ``tell`` runs untouched. ``ties="argsort"`` restores pycma's plain behaviour.
The adapter tells pycma the candidates sorted by value, ties by genome bytes
(:func:`canonical_order`), so permuting tied candidates changes nothing, to the last bit; with
TPA step-size adaptation (pycma's default for D >= 300), which reads its mirrored pair from
places 0 and 1 of the ask order, those two places keep the caller's order.
"""

from __future__ import annotations

import copy
import io
import logging
import pickle
from typing import Any, Literal

import cma
import numpy as np

from strategies.base import PlainUnpickler, Strategy, average_over_ties

__all__ = ["CMAES", "SepCMAES", "AUTO_DIAGONAL_DIM", "LEGACY_CLASSES", "MAX_FULL_DIM", "TIES", "canonical_order",
           "check_ties", "dumps_es", "has_ties", "loads_es", "tie_weights"]

log = logging.getLogger("essa.strategies")

AUTO_DIAGONAL_DIM = 2000
"""``diagonal="auto"`` switches to separable CMA-ES when D exceeds this (module docstring: the
full-covariance checkpoint stays within 5 % of a generation up to here)."""

MAX_FULL_DIM = 8192
"""Full covariance (``diagonal=False``) is refused above this D: C and its eigenbasis take
2 x D^2 x 8 bytes (1.07 GB at 8192) in memory and in every generation's checkpoint."""


TIES = ("average", "argsort")
"""``strategy.options.ties``: average the recombination weights over tied ranks, or keep the
library's argsort order (tied candidates weighted by their place in the ask order)."""


def check_ties(ties: object) -> str:
    """Validate ``strategy.options.ties``.

    Returns:
        ``ties`` unchanged, one of :data:`TIES`.

    Raises:
        ValueError: for anything else (one line naming the field and the choices).
    """
    if not (isinstance(ties, str) and ties in TIES):
        raise ValueError(f"strategy.options.ties must be 'average' or 'argsort' (got {ties!r}); "
                         "'average' gives tied fitness equal weights")
    return ties


def tie_weights(weights: np.ndarray, mu: int, sorted_values: np.ndarray) -> tuple[np.ndarray, int]:
    """CMA-ES recombination weights averaged over tied ranks (module docstring, "Ties").

    Args:
        weights: (P,) float sorted-rank weights, best rank first: positive for the first ``mu``
            (summing to 1, the mean's), then zero or negative (active CMA; Hansen 2016,
            arXiv 1604.00772, eq. 53).
        mu: number of positive weights, 1 <= mu <= P.
        sorted_values: (P,) float objective values in the same best-first order (ties contiguous).

    Returns:
        ``(w, mu_tied)``: (P,) float64 weights, equal within every tied group and still
        non-increasing, and the new count of positive weights. A group wholly within the first
        ``mu`` ranks or wholly after them gets the mean of its weights; a group straddling
        ``mu`` gets its positive mass shared equally and its negative weights dropped, so
        ``w[:mu_tied]`` still sums to 1.

    Raises:
        ValueError: on mismatched shapes or ``mu`` outside [1, P].
    """
    w = np.asarray(weights, dtype=np.float64)
    values = np.asarray(sorted_values, dtype=np.float64)
    P = len(w)
    if w.ndim != 1 or values.shape != w.shape or not 1 <= mu <= P:
        raise ValueError(f"tie_weights: weights {w.shape}, values {values.shape} and mu={mu} must be (P,), (P,), 1..P")
    positive = np.where(np.arange(P) < mu, w, 0.0)
    negative = w - positive
    starts = np.r_[0, np.flatnonzero(values[1:] != values[:-1]) + 1]
    ends = np.r_[starts[1:], P]
    straddles = (starts < mu) & (ends > mu)
    negative[np.repeat(straddles, ends - starts)] = 0.0  # the straddling group keeps its positive mass only
    tied = average_over_ties(values, positive) + average_over_ties(values, negative)
    return tied, int(ends[starts < mu][-1])


def canonical_order(genomes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Order candidates by value, ties by their genome's bytes.

    Telling a library the candidates in this order makes its update independent of the order
    the caller passed them in, to the last bit (its internal sort then sees one fixed input).

    Args:
        genomes: (P, D) float64 candidates.
        values: (P,) float64 values, ascending = first.

    Returns:
        (P,) int64 permutation.
    """
    keys = [g.tobytes() for g in np.ascontiguousarray(genomes, dtype=np.float64)]
    return np.array(sorted(range(len(values)), key=lambda i: (float(values[i]), keys[i])), dtype=np.int64)


def has_ties(values: np.ndarray) -> bool:
    """True if two of the (P,) ``values`` are equal."""
    return len(np.unique(values)) < len(values)


class _GeneratorRandn:
    """pycma's ``randn(*shape)`` drawn from a ``np.random.Generator`` instead of global state.

    The generator is not pickled with the pycma object: the strategy owns it, saves its
    state, and re-binds it after loading (one source of truth for the random state).
    """

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def __call__(self, *shape: int) -> np.ndarray:
        return self.rng.standard_normal(shape)

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.rng = None  # a checkpoint from before 2026-12: re-bound by loads_es


_RANDN = "essa:randn"
"""The persistent id of the strategy's sampler in pycma's pickle (:func:`dumps_es`)."""

LEGACY_CLASSES = {("strategies.cma_es", "_GeneratorRandn"): _GeneratorRandn}
"""Project classes older checkpoints name inside pycma's pickle, by the path they were written under."""


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> str | None:
        return _RANDN if isinstance(obj, _GeneratorRandn) else None


class _Unpickler(PlainUnpickler):
    def __init__(self, f, rng: np.random.Generator):
        super().__init__(f, classes=LEGACY_CLASSES, modules=("cma", "numpy.linalg"))  # pycma's classes, eigh
        self.randn = _GeneratorRandn(rng)

    def persistent_load(self, pid: Any) -> Any:
        if pid != _RANDN:
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r} in pycma's pickle")
        return self.randn


def dumps_es(es: cma.CMAEvolutionStrategy) -> bytes:
    """pycma's object pickled without this module's classes: its ``randn`` sampler (in ``opts``,
    ``inopts`` and the sampler ``sm``) becomes a persistent id (:func:`loads_es` binds it again)."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=4).dump(es)
    return buf.getvalue()


def loads_es(data: bytes, rng: np.random.Generator) -> cma.CMAEvolutionStrategy:
    """The pycma object of :func:`dumps_es` (or of ``es.pickle_dumps()``, checkpoints before 2026-12),
    sampling from ``rng``; only pycma's, numpy's and :data:`LEGACY_CLASSES`' classes load.

    Raises:
        pickle.UnpicklingError: the bytes name another class (one line naming it).
    """
    es = _Unpickler(io.BytesIO(data), rng).load()
    randn = es.opts["randn"]
    if isinstance(randn, _GeneratorRandn):  # a legacy pickle's sampler, restored unbound
        randn.rng = rng
    return es


class CMAES(Strategy):
    """CMA-ES (pycma) behind the ask/tell contract; fitness is maximised.

    Args:
        dim, x0, seed, population_size, sigma0: see :class:`strategies.base.Strategy`
            (pycma's ``x0``, ``sigma0``, ``popsize``).
        diagonal: True = separable CMA-ES (``CMA_diagonal=True``), False = full covariance
            (ESSA; refused above ``MAX_FULL_DIM``), "auto" = full up to ``AUTO_DIAGONAL_DIM``
            (2000), separable above (module docstring: checkpoint size and time).
        cma_options: further pycma options passed through unchanged (e.g. ``{"CMA_active":
            False}``); ``popsize``, ``randn``, ``seed``, ``CMA_diagonal`` are set here and may
            not be overridden. Logging is off (no ``outcmaes/`` files) unless re-enabled.
        ties: ``"average"`` (default): tied fitness gets tied weights (:func:`tie_weights`,
            module docstring); ``"argsort"``: pycma's plain ranking.

    Raises:
        ValueError: on a bad ``diagonal`` or ``ties``, ``diagonal=False`` with D >
            ``MAX_FULL_DIM``, a reserved key in ``cma_options``, or ``ties="average"`` with a
            pycma option that reorders or penalises the told candidates (``CMA_elitist``, the
            ``BoundPenalty`` boundary handler).

    ``state_dict()["strategy"]`` holds ``es`` (bytes, pycma's object: :func:`dumps_es`).
    """

    _RESERVED = ("popsize", "randn", "seed", "CMA_diagonal")

    def __init__(
        self,
        dim: int,
        x0: np.ndarray | None,
        seed: int,
        population_size: int,
        sigma0: float,
        *,
        diagonal: bool | Literal["auto"] = "auto",
        cma_options: dict[str, Any] | None = None,
        ties: str = "average",
        **options: Any,
    ) -> None:
        super().__init__(dim, x0, seed, population_size, sigma0, **options)
        self.ties = check_ties(ties)
        if isinstance(diagonal, str) and diagonal == "auto":
            diagonal = self.dim > AUTO_DIAGONAL_DIM
            if diagonal:
                log.info("CMA-ES: D=%d > %d, separable (diagonal) covariance (strategy.options.diagonal=auto; "
                         "full would keep %.0f MB and checkpoint it every generation)", self.dim, AUTO_DIAGONAL_DIM,
                         2 * 8 * self.dim ** 2 / 1e6)
        if not isinstance(diagonal, (bool, np.bool_)):
            raise ValueError(f"strategy.options.diagonal must be true, false or 'auto' (got {diagonal!r})")
        if not diagonal and self.dim > MAX_FULL_DIM:
            raise ValueError(
                f"strategy.options.diagonal=false at D={self.dim}: full covariance keeps {2 * 8 * self.dim ** 2 / 1e9:.1f} GB "
                f"(C and its eigenbasis) and rewrites it in every generation's checkpoint, allowed up to D={MAX_FULL_DIM}; "
                f"set strategy.options.diagonal=auto or true, or shrink the genome (strategy.genome.alpha, lora.rank)")
        self.diagonal = bool(diagonal)
        cma_options = dict(cma_options or {})
        reserved = sorted(set(cma_options) & set(self._RESERVED))
        if reserved:
            raise ValueError(
                f"strategy.options.cma_options may not set {', '.join(reserved)}; use strategy.population_size, "
                "seed and strategy.options.diagonal instead"
            )
        opts = {"verbose": -9, "verb_disp": 0, "verb_log": 0, **cma_options}
        opts.update(
            popsize=self.population_size,
            randn=_GeneratorRandn(self.rng),
            seed=np.nan,  # NaN: pycma leaves numpy's global generator alone
            CMA_diagonal=self.diagonal,
        )
        self.es = cma.CMAEvolutionStrategy(self.x0, self.sigma0, opts)
        if self.ties == "average":
            self._check_order_free()

    def _check_order_free(self) -> None:
        es = self.es
        conflict = ("CMA_elitist" if es.opts["CMA_elitist"] else
                    "BoundPenalty" if isinstance(es.boundary_handler, cma.boundary_handler.BoundPenalty) else None)
        if conflict:
            raise ValueError(f"strategy.options.ties=average cannot be combined with pycma's {conflict} (its tell "
                             "depends on the candidates' order); set strategy.options.ties=argsort or drop that option")

    def _ask(self) -> np.ndarray:
        self._last_ask = np.asarray(self.es.ask())  # (P, D)
        return self._last_ask.copy()

    def _tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        # pycma's TPA step-size adaptation (its default for D >= 300) draws from numpy's global
        # generator in check_consistency (np.random.randint, from iteration 4); put it back
        global_state = np.random.get_state()
        genomes, fitness = self._in_ask_order(genomes, fitness)
        try:
            self._tell_pycma(genomes, -fitness)  # pycma minimises: negate here only
        finally:
            np.random.set_state(global_state)

    def _in_ask_order(self, genomes: np.ndarray, fitness: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(genomes (P, D), fitness (P,)) in the order ``ask`` gave them, when they are the last ask's genomes
        in another order: pycma reads TPA's pair and injected solutions by their place in the ask, so a tell
        must not depend on the order the caller lists the candidates in."""
        asked = getattr(self, "_last_ask", None)
        if asked is None or asked.shape != genomes.shape:
            return genomes, fitness
        index = {g.tobytes(): i for i, g in enumerate(genomes)}
        if len(index) != len(genomes) or any(a.tobytes() not in index for a in asked):
            return genomes, fitness
        order = [index[a.tobytes()] for a in asked]
        return genomes[order], fitness[order]

    def _tell_pycma(self, genomes: np.ndarray, values: np.ndarray) -> None:
        if self.ties == "argsort" or not has_ties(values):
            self.es.tell(list(genomes), list(values))
            return
        # (P,) one pycma input for any order within ties; TPA (pycma's step size for D >= 300) reads
        # its mirrored pair from places 0 and 1 of ask's order, so those two stay where they are
        keep = 2 if self.es.mean_shift_samples else 0
        order = np.r_[np.arange(keep), keep + canonical_order(genomes[keep:], values[keep:])]
        pycma_weights = self.es.sp.weights
        tied = copy.copy(pycma_weights)  # RecombinationWeights (a list) with its attributes, mueff included
        weights, tied.mu = tie_weights(np.asarray(pycma_weights), pycma_weights.mu, np.sort(values))
        tied[:] = weights.tolist()
        self.es.sp.weights = tied
        try:
            self.es.tell([genomes[i] for i in order], [float(values[i]) for i in order])
        finally:
            self.es.sp.weights = pycma_weights  # the state keeps pycma's weights: exact resume

    @property
    def sigma(self) -> float:
        """pycma's overall step size ``es.sigma``."""
        return float(self.es.sigma)

    @property
    def mean(self) -> np.ndarray:
        """(D,) float64 copy of pycma's distribution mean ``es.mean``."""
        return np.array(self.es.mean, dtype=np.float64)

    def _set_mean(self, mean: np.ndarray) -> None:
        self.es.mean = np.array(mean, dtype=np.float64)  # genotype = phenotype: no transformation is set

    def _state_dict(self) -> dict[str, Any]:
        return {"es": dumps_es(self.es), "diagonal": self.diagonal}

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        if state["diagonal"] != self.diagonal:
            raise ValueError(
                f"load_state_dict: checkpoint has diagonal={state['diagonal']}, this strategy {self.diagonal}; "
                "build it with the checkpoint's strategy.options.diagonal"
            )
        self.es = loads_es(state["es"], self.rng)  # the generator whose state the base class has just restored


class SepCMAES(CMAES):
    """Separable CMA-ES: :class:`CMAES` with ``diagonal=True`` fixed (Ros & Hansen 2008).

    The strategy for large genomes such as :class:`strategies.genomes.LoRAGenome`.

    Raises:
        ValueError: if ``diagonal`` is given as anything but True.
    """

    def __init__(
        self, dim: int, x0: np.ndarray | None, seed: int, population_size: int, sigma0: float, **options: Any
    ) -> None:
        if options.setdefault("diagonal", True) is not True:
            raise ValueError(
                "sep_cma is always diagonal; use strategy=cma_es with strategy.diagonal=false for full covariance"
            )
        super().__init__(dim, x0, seed, population_size, sigma0, **options)
