"""RandOpt-style search: perturb around the current model, keep the top K, average them into the next model.

The ensemble step of Iterative RandOpt (repository sunrainyg/RandOpt, README and configs: random weight
perturbations, the top-K of them by reward, folded into one model, in rounds), on the genome and with the
fold done by averaging the selected genomes instead of SFT on the ensemble's answers::

    x_i = centre + sigma0 eps_i,  eps_i ~ N(0, I_D)                 # (P, D)
    w   = selection_weights(fitness, top_k)                         # 1/K on the K best, ties averaged
    centre <- centre + lr (sum_i w_i x_i - centre)                  # lr 1: the top-K average itself

With lr 1 the centre moves to the top-K average, sigma0 sqrt(D / K) from the old centre in the directions
the selection did not see: K trades selection pressure against that noise (K = P / 4 by default).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from strategies.perturb import CentredPerturbation, check_count, check_positive, selection_weights

__all__ = ["RandOpt"]


class RandOpt(CentredPerturbation):
    """RandOpt-style top-K averaging (module docstring) behind the ask/tell contract; fitness is maximised.

    Args:
        dim, x0, seed, population_size, sigma0: see :class:`strategies.base.Strategy`; sigma stays sigma0.
        top_k: K, candidates averaged into the next centre, 1 <= K <= P; None = max(1, P // 4).
        lr: fraction of the way from the centre to the top-K average taken per generation, in (0, 1].
        mirrored: sample mirrored pairs (:class:`strategies.perturb.CentredPerturbation`).

    Raises:
        ValueError: a bad ``top_k``, ``lr`` or ``mirrored`` (one line naming ``strategy.options.<field>``).
    """

    def __init__(self, dim: int, x0: np.ndarray | None, seed: int, population_size: int, sigma0: float, *,
                 top_k: int | None = None, lr: float = 1.0, **options: Any) -> None:
        super().__init__(dim, x0, seed, population_size, sigma0, **options)
        P = self.population_size
        self.top_k = check_count(max(1, P // 4) if top_k is None else top_k, "top_k", 1, P, str(max(1, P // 4)))
        self.lr = check_positive(lr, "lr", "1.0")
        if self.lr > 1:
            raise ValueError(f"strategy.options.lr must be in (0, 1] (got {lr!r}): 1 moves the centre onto the "
                             "top-K average, e.g. strategy.options.lr=1.0")

    def _update(self, genomes: np.ndarray, fitness: np.ndarray) -> np.ndarray:
        w = selection_weights(fitness, self.top_k)  # (P,), sums to 1
        return self._mean + self.lr * (w @ genomes - self._mean)
