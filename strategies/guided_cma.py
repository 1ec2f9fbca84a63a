"""Guided CMA-ES: CMA-ES (pycma) with a proposed direction injected into every generation.

Guided ES (Maheswaranathan, Metz, Tucker, Choi, Sohl-Dickstein, "Guided evolutionary strategies",
ICML 2019, arXiv 1806.10230) samples from a covariance elongated along surrogate gradient directions;
pycma's way to hand it a proposal is ``CMAEvolutionStrategy.inject`` (the proposed point enters the next
population as a direction from the mean, rescaled to the sample distribution's Mahalanobis size when
longer, and is left out of the active covariance update). The surrogate here is a ridge regression of
fitness on the genomes seen so far (the last ``history`` generations)::

    y_j = centred rank of fitness_j in its generation, ties averaged  # the minibatch's difficulty cancels
    X_j = genome_j - mean                                            # (n, D), n = history x P
    w   = X^T (X X^T + lambda I)^-1 y,  lambda = ridge tr(X X^T) / n  # (D,) the dual form: n << D
    inject  mean + sigma sqrt(D) k / injections w / |w|,  k = 1 .. injections

Step size (``step_size``): ``default`` is pycma's (CSA below D 300, two-point adaptation TPA from 300:
Hansen, "CMA-ES with two-point step-size adaptation", arXiv 0805.0231); ``tpa`` or ``csa`` force one.
TPA is the step-size rule pycma's author recommends for noisy problems alongside a noise handler
(pycma issue 262). An ``ask`` before the previous population is told returns it again: pycma hands out the
injected proposals and TPA's mean-shift pair to the first ``ask`` only. Everything else (ties, resume, diagonal) is :class:`strategies.cma_es.CMAES`.
"""
from __future__ import annotations

from typing import Any

import cma
import numpy as np

from strategies.cma_es import CMAES, canonical_order
from strategies.openai_es import centred_ranks
from strategies.perturb import check_count, check_positive

__all__ = ["GuidedCMAES", "STEP_SIZES", "ridge_direction"]

STEP_SIZES = {"default": True, "csa": cma.sigma_adaptation.CMAAdaptSigmaCSA, "tpa": cma.sigma_adaptation.CMAAdaptSigmaTPA}
"""``strategy.options.step_size`` -> pycma's ``AdaptSigma`` option."""


def ridge_direction(X: np.ndarray, y: np.ndarray, ridge: float) -> np.ndarray | None:
    """The unit ridge-regression direction of y on X (module docstring), or None when it is undefined.

    Args:
        X: (n, D) float64 genomes relative to the mean. y: (n,) float64 centred ranks of the fitness. ridge: > 0,
            lambda as a fraction of the mean squared row norm.

    Returns:
        (D,) float64 unit vector, or None when y or X is all zero (no signal to regress on).
    """
    K = X @ X.T  # (n, n)
    scale = np.trace(K) / len(y)
    if scale <= 0 or not np.any(y):
        return None
    w = X.T @ np.linalg.solve(K + ridge * scale * np.eye(len(y)), y)  # (D,)
    norm = np.linalg.norm(w)
    return w / norm if norm > 0 else None


class GuidedCMAES(CMAES):
    """CMA-ES with a ridge-regression direction injected every generation (module docstring); maximises fitness.

    Args:
        dim, x0, seed, population_size, sigma0, diagonal, ties: see :class:`strategies.cma_es.CMAES`.
        injections: proposals injected per generation, 0 <= k <= P - 2 (0: plain CMA-ES with the archive).
        history: generations of (genome, fitness) the regression sees, >= 1.
        ridge: the ridge penalty as a fraction of the mean squared row norm (> 0).
        step_size: ``default`` | ``csa`` | ``tpa`` (pycma's ``AdaptSigma``).
        cma_options: further pycma options (``AdaptSigma`` is set by ``step_size``).

    Raises:
        ValueError: a bad option (one line naming ``strategy.options.<field>``).

    ``state_dict()["strategy"]`` adds ``archive_x`` ((n, D) float64), ``archive_y`` ((n,)) and
    ``archive_generation`` ((n,) int64) and ``asked`` ((P, D) or None) to CMAES's state.
    """

    def __init__(self, dim: int, x0: np.ndarray | None, seed: int, population_size: int, sigma0: float, *,
                 injections: int = 1, history: int = 5, ridge: float = 1.0, step_size: str = "default",
                 cma_options: dict[str, Any] | None = None, **options: Any) -> None:
        if not (isinstance(step_size, str) and step_size in STEP_SIZES):
            raise ValueError(f"strategy.options.step_size must be one of {', '.join(STEP_SIZES)} (got {step_size!r})")
        if "AdaptSigma" in (cma_options or {}):
            raise ValueError("strategy.options.cma_options may not set AdaptSigma for strategy=guided_cma; "
                             "use strategy.options.step_size=default|csa|tpa")
        super().__init__(dim, x0, seed, population_size, sigma0,
                         cma_options={**(cma_options or {}), "AdaptSigma": STEP_SIZES[step_size]}, **options)
        self.injections = check_count(injections, "injections", 0, self.population_size - 2, "1")
        self.history = check_count(history, "history", 1, 10 ** 6, "5")
        self.ridge = check_positive(ridge, "ridge", "1.0")
        self.step_size = step_size
        self._x, self._y = np.zeros((0, self.dim)), np.zeros(0)
        self._told_generation = np.zeros(0, dtype=np.int64)
        self._asked: np.ndarray | None = None  # (P, D) asked, not yet told

    def _ask(self) -> np.ndarray:
        if self._asked is None:
            self._asked = super()._ask()
        return self._asked.copy()

    def _tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        super()._tell(genomes, fitness)
        self._asked = None
        order = canonical_order(genomes, fitness)  # the archive does not depend on the ask order
        keep = self._told_generation > self.generation - self.history
        self._x = np.vstack([self._x[keep], genomes[order]])
        self._y = np.r_[self._y[keep], centred_ranks(fitness[order])]  # ranks: a failed (NaN) candidate's stand-in value does not count
        self._told_generation = np.r_[self._told_generation[keep], np.full(len(order), self.generation)]
        if self.injections:
            self._inject()

    def _inject(self) -> None:
        mean = self.mean
        direction = ridge_direction(self._x - mean, self._y, self.ridge)
        if direction is None:
            return
        length = self.sigma * np.sqrt(self.dim)
        self.es.inject([mean + length * (k + 1) / self.injections * direction for k in range(self.injections)])

    def _state_dict(self) -> dict[str, Any]:
        return {**super()._state_dict(), "archive_x": self._x.copy(), "archive_y": self._y.copy(),
                "archive_generation": self._told_generation.copy(),
                "asked": None if self._asked is None else self._asked.copy()}

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        super()._load_state_dict(state)
        self._x = np.array(state["archive_x"], dtype=np.float64)
        self._y = np.array(state["archive_y"], dtype=np.float64)
        self._told_generation = np.array(state["archive_generation"], dtype=np.int64)
        self._asked = None if state["asked"] is None else np.array(state["asked"], dtype=np.float64)
