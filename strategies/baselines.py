"""The skeptic's baselines (issue 39): what a search must beat to show that it searches.

* :class:`RandomSearch`: the best of the same number of random genomes at the same sigma, ``x0 + sigma0
  eps``, eps ~ N(0, I_D), P per generation and never re-centred (Bergstra & Bengio, "Random Search for
  Hyper-Parameter Optimization", JMLR 13, 2012). Candidates of different generations saw different
  minibatches, so a candidate is judged by its fitness minus its generation's median (the minibatch's
  difficulty cancels); the mean is the best so judged (ties: the incumbent stays; within a generation the
  first of :func:`strategies.cma_es.canonical_order`, so the ask order does not matter).
* :class:`ScaleSearch`: a 1-D search over the warm start's scale. In the SVD-LoRA genome in relative mode
  (strategies/genomes.py, singular values s (1 + x)) multiplying every searched singular value by c is the
  genome ``x = (c - 1) ones``; at alpha 1 that scales both factors of every adapter, so B A by c^2. Each
  generation asks P values of t = c - 1 over ``t_centre +- span``, one uniformly at random in each of P
  equal strata (stratified, so that generations together cover the line densely; ``span`` starts at
  ``strategy.options.span``, default sigma0, and shrinks by ``shrink`` per generation); after the tell,
  ``t_centre`` is the maximum of a quadratic fitted by least squares to the generation's (t, u), u the
  centred rank of each fitness (ties averaged; ranks, so a failed candidate's stand-in value does not
  count), where that fit is concave and its maximum lies inside the t range asked; else the t with the
  highest u. Ranks of generations that asked different ranges do not compare, so each fit sees one
  generation; the shrinking span averages the minibatches' noise out as the search closes in.
  The mean is ``x0 + t_centre ones``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from strategies.base import Strategy
from strategies.cma_es import canonical_order
from strategies.openai_es import centred_ranks
from strategies.perturb import check_positive

__all__ = ["RandomSearch", "ScaleSearch", "fit_scale"]


class RandomSearch(Strategy):
    """Best of random genomes around x0 (module docstring); fitness is maximised.

    Args:
        dim, x0, seed, population_size, sigma0: see :class:`strategies.base.Strategy` (sigma stays sigma0).

    ``state_dict()["strategy"]`` holds ``incumbent`` ((D,) float64) and ``advantage`` (its fitness minus
    its generation's median; -inf before the first tell).
    """

    def __init__(self, dim: int, x0: np.ndarray | None, seed: int, population_size: int, sigma0: float,
                 **options: Any) -> None:
        super().__init__(dim, x0, seed, population_size, sigma0, **options)
        self._incumbent, self._advantage = self.x0.copy(), -np.inf

    def _ask(self) -> np.ndarray:
        return self.x0 + self.sigma0 * self.rng.standard_normal((self.population_size, self.dim))  # (P, D)

    def _tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        advantage = fitness - np.median(fitness)  # (P,)
        best = int(canonical_order(genomes, -advantage)[0])  # the highest; ties by genome bytes
        if advantage[best] > self._advantage:
            self._incumbent, self._advantage = genomes[best].copy(), float(advantage[best])

    @property
    def sigma(self) -> float:
        """The fixed sampling standard deviation, sigma0."""
        return self.sigma0

    @property
    def mean(self) -> np.ndarray:
        """(D,) float64 copy of the incumbent (x0 before the first tell)."""
        return self._incumbent.copy()

    def _set_mean(self, mean: np.ndarray) -> None:
        self._incumbent = np.array(mean, dtype=np.float64)

    def _state_dict(self) -> dict[str, Any]:
        return {"incumbent": self._incumbent.copy(), "advantage": self._advantage}

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        self._incumbent, self._advantage = np.array(state["incumbent"], dtype=np.float64), float(state["advantage"])


def fit_scale(t: np.ndarray, u: np.ndarray) -> float:
    """The t = c - 1 that a scale search moves to, from one generation (module docstring).

    Args:
        t: (n,) float64 scale offsets told. u: (n,) their fitness's centred ranks.

    Returns:
        The vertex of the least-squares fit ``u ~ a + b t + q t^2`` when q < 0 and the vertex lies within
        [min t, max t]; else the t with the highest u (the lowest t among ties).
    """
    X = np.column_stack([np.ones_like(t), t, t * t])  # (n, 3)
    _, b, q = np.linalg.lstsq(X, u, rcond=None)[0]
    if q < 0 and t.min() <= -b / (2 * q) <= t.max():
        return float(-b / (2 * q))
    return float(t[u == u.max()].min())


class ScaleSearch(Strategy):
    """1-D search over the warm start's scale, ``x = x0 + (c - 1) ones`` (module docstring); maximises fitness.

    Args:
        dim, x0, seed, population_size, sigma0: see :class:`strategies.base.Strategy`.
        span: half-width of the first generation's t = c - 1 interval (> 0); None = sigma0.
        shrink: factor (0, 1] the half-width is multiplied by after each generation.

    Raises:
        ValueError: a bad ``span`` or ``shrink`` (one line naming ``strategy.options.<field>``).

    ``state_dict()["strategy"]`` holds ``t_centre`` and ``span`` (floats).
    """

    def __init__(self, dim: int, x0: np.ndarray | None, seed: int, population_size: int, sigma0: float, *,
                 span: float | None = None, shrink: float = 0.7, **options: Any) -> None:
        super().__init__(dim, x0, seed, population_size, sigma0, **options)
        self.span0 = check_positive(self.sigma0 if span is None else span, "span", "1.0")
        self.shrink = check_positive(shrink, "shrink", "0.7")
        if self.shrink > 1:
            raise ValueError(f"strategy.options.shrink must be in (0, 1] (got {shrink!r}), e.g. strategy.options.shrink=0.7")
        self._t_centre, self._span = 0.0, self.span0

    def _offsets(self) -> np.ndarray:
        P = self.population_size
        strata = (np.arange(P) + self.rng.uniform(size=P)) / P  # (P,) one point in each of P strata of [0, 1)
        return self._t_centre + self._span * (2.0 * strata - 1.0)

    def _ask(self) -> np.ndarray:
        return self.x0 + self._offsets()[:, None] * np.ones(self.dim)  # (P, D)

    def _tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        t = (genomes - self.x0).mean(axis=1)  # (P,): the told genomes' own offsets
        self._t_centre = fit_scale(t, centred_ranks(fitness))
        self._span *= self.shrink

    @property
    def sigma(self) -> float:
        """The current half-width of the t = c - 1 interval asked."""
        return self._span

    @property
    def mean(self) -> np.ndarray:
        """(D,) float64: ``x0 + t_centre ones``."""
        return self.x0 + self._t_centre

    def _set_mean(self, mean: np.ndarray) -> None:
        self._t_centre = float(np.mean(np.asarray(mean, dtype=np.float64) - self.x0))  # its projection on the line

    def _state_dict(self) -> dict[str, Any]:
        return {"t_centre": self._t_centre, "span": self._span}

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        self._t_centre, self._span = float(state["t_centre"]), float(state["span"])
