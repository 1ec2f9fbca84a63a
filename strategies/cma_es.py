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
generator's ``bit_generator.state`` and the adapter saves ``es.pickle_dumps()``, so a
restored strategy samples exactly what the original would have.
"""

from __future__ import annotations

import logging
import pickle
from typing import Any, Literal

import cma
import numpy as np

from strategies.base import Strategy

__all__ = ["CMAES", "SepCMAES", "AUTO_DIAGONAL_DIM", "MAX_FULL_DIM"]

log = logging.getLogger("essa.strategies")

AUTO_DIAGONAL_DIM = 2000
"""``diagonal="auto"`` switches to separable CMA-ES when D exceeds this (module docstring: the
full-covariance checkpoint stays within 5 % of a generation up to here)."""

MAX_FULL_DIM = 8192
"""Full covariance (``diagonal=False``) is refused above this D: C and its eigenbasis take
2 x D^2 x 8 bytes (1.07 GB at 8192) in memory and in every generation's checkpoint."""


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
        self.rng = None  # re-bound by CMAES._load_state_dict


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

    Raises:
        ValueError: on a bad ``diagonal``, ``diagonal=False`` with D > ``MAX_FULL_DIM``, or a
            reserved key in ``cma_options``.

    ``state_dict()["strategy"]`` holds ``es`` (bytes, ``es.pickle_dumps()``).
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
        **options: Any,
    ) -> None:
        super().__init__(dim, x0, seed, population_size, sigma0, **options)
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

    def _ask(self) -> np.ndarray:
        return np.asarray(self.es.ask())  # (P, D)

    def _tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        self.es.tell(list(genomes), list(-fitness))  # pycma minimises: negate here only

    @property
    def sigma(self) -> float:
        """pycma's overall step size ``es.sigma``."""
        return float(self.es.sigma)

    @property
    def mean(self) -> np.ndarray:
        """(D,) float64 copy of pycma's distribution mean ``es.mean``."""
        return np.array(self.es.mean, dtype=np.float64)

    def _state_dict(self) -> dict[str, Any]:
        return {"es": self.es.pickle_dumps(), "diagonal": self.diagonal}

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        if state["diagonal"] != self.diagonal:
            raise ValueError(
                f"load_state_dict: checkpoint has diagonal={state['diagonal']}, this strategy {self.diagonal}; "
                "build it with the checkpoint's strategy.options.diagonal"
            )
        self.es = pickle.loads(state["es"])
        # the pycma object and its sampler share one _GeneratorRandn; bind it to our generator,
        # whose state the base class has just restored
        self.es.opts["randn"].rng = self.rng


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
