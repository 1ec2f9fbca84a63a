"""Perturb-select-fold strategies: a centre genome, fixed-sigma Gaussian perturbations around it, and an
update that folds the selected perturbations back into the centre (RandOpt, MeZO-GV).

The shared part, :class:`CentredPerturbation`, asks ``centre + sigma0 eps`` (optionally in mirrored pairs
+eps / -eps, Salimans et al. 2017, arXiv 1703.03864, §2.1) and keeps the centre in its state; a subclass
writes its update in :meth:`CentredPerturbation._update` from the told genomes and the selection weights
of :func:`selection_weights`, which give tied fitness tied weights (strategies/base.py, "Tied fitness").
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from strategies.base import FixedSigmaCentre, Strategy, average_over_ties

__all__ = ["CentredPerturbation", "check_count", "check_positive", "mirrored_noise", "selection_weights"]


def selection_weights(fitness: np.ndarray, top: int, bottom: int = 0) -> np.ndarray:
    """Weights +1/top on the ``top`` best candidates and -1/bottom on the ``bottom`` worst, averaged over ties.

    Args:
        fitness: (P,) float64, finite, higher is better. top: 1 <= top <= P. bottom: 0 <= bottom <= P - top.

    Returns:
        (P,) float64 in the candidates' order: a tied group that straddles a group's boundary shares that
        group's weight equally (the mid-rank convention, :func:`strategies.base.average_over_ties`), so the
        weights do not depend on where tied candidates sit in the ask order; the positive weights sum to 1,
        the negative ones to -1 (or 0 without a bottom group).
    """
    f = np.asarray(fitness, dtype=np.float64)
    P = len(f)
    order = np.argsort(-f, kind="stable")  # best first
    placed = np.zeros(P)
    placed[:top] = 1.0 / top
    if bottom:
        placed[P - bottom:] = -1.0 / bottom
    positive, negative = np.clip(placed, 0, None), np.clip(placed, None, 0)
    sorted_f = f[order]
    w = np.empty(P)
    w[order] = average_over_ties(sorted_f, positive) + average_over_ties(sorted_f, negative)
    return w


def mirrored_noise(rng: np.random.Generator, pairs: int, dim: int) -> np.ndarray:
    """(2 pairs, D) float64 standard normal noise in mirrored pairs: rows i and i + pairs are +eps, -eps
    (Salimans et al. 2017, arXiv 1703.03864, §2.1)."""
    half = rng.standard_normal((pairs, dim))
    return np.concatenate([half, -half])


def check_count(value: object, field: str, low: int, high: int, example: str) -> int:
    """``value`` as an int in [low, high], else a one-line ValueError naming ``strategy.options.<field>``; its
    example is ``example`` moved into [low, high] (a fixed default can lie outside a small population's range)."""
    if not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and low <= value <= high):
        raise ValueError(f"strategy.options.{field} must be an integer in [{low}, {high}] (got {value!r}), "
                         f"e.g. strategy.options.{field}={min(max(int(example), low), high)}")
    return int(value)


def check_positive(value: object, field: str, example: str) -> float:
    """``value`` as a finite float > 0, else a one-line ValueError naming ``strategy.options.<field>``."""
    if not (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0):
        raise ValueError(f"strategy.options.{field} must be a finite number > 0 (got {value!r}), "
                         f"e.g. strategy.options.{field}={example}")
    return float(value)


class CentredPerturbation(FixedSigmaCentre, Strategy):
    """Fixed-sigma Gaussian perturbations of a centre genome; the subclass folds the selected ones back.

    Args:
        dim, x0, seed, population_size, sigma0: see :class:`strategies.base.Strategy` (sigma stays sigma0).
        mirrored: sample P/2 pairs +eps, -eps (P must then be even) instead of P independent eps.

    ``state_dict()["strategy"]`` holds ``mean`` ((D,) float64), the centre.
    """

    def __init__(self, dim: int, x0: np.ndarray | None, seed: int, population_size: int, sigma0: float, *,
                 mirrored: bool = False, **options: Any) -> None:
        super().__init__(dim, x0, seed, population_size, sigma0, **options)
        if not isinstance(mirrored, (bool, np.bool_)):
            raise ValueError(f"strategy.options.mirrored must be true or false (got {mirrored!r})")
        if mirrored and self.population_size % 2:
            raise ValueError(f"strategy.population_size must be even with strategy.options.mirrored=true (got "
                             f"{self.population_size}): candidates come in pairs +eps, -eps")
        self.mirrored = bool(mirrored)
        self._mean = self.x0.copy()

    def _ask(self) -> np.ndarray:
        P = self.population_size
        if self.mirrored:
            eps = mirrored_noise(self.rng, P // 2, self.dim)  # (P, D): pairs i, i + P/2
        else:
            eps = self.rng.standard_normal((P, self.dim))  # (P, D)
        return self._mean + self.sigma0 * eps

    def _tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        self._mean = self._update(genomes, fitness)

    def _update(self, genomes: np.ndarray, fitness: np.ndarray) -> np.ndarray:
        """The next centre (D,) from genomes (P, D) and finite fitness (P,) (maximised)."""
        raise NotImplementedError

    def _state_dict(self) -> dict[str, Any]:
        return {"mean": self._mean.copy()}

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        self._mean = np.array(state["mean"], dtype=np.float64)
