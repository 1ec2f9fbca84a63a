"""A third-party strategy in one file: Gaussian random search around the best genome so far.

Use it without editing essa-engine, by dotted path (``strategy.name=essa_plugin_example.RandomSearch``)
or by an entry point in your own package's pyproject.toml::

    [project.entry-points."essa.strategies"]
    random_search = "essa_plugin_example:RandomSearch"
"""

import numpy as np

from strategies import Strategy


class RandomSearch(Strategy):
    """Sample N(best so far, sigma0^2 I); the base class tracks the best and saves the RNG."""

    def _ask(self) -> np.ndarray:
        noise = self.rng.standard_normal((self.population_size, self.dim))  # (P, D)
        return self.mean + self.sigma0 * noise

    def _tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        pass  # nothing to learn beyond the best genome, which the base class keeps

    @property
    def sigma(self) -> float:
        return self.sigma0

    @property
    def mean(self) -> np.ndarray:
        return (self.x0 if self.best_genome is None else self.best_genome).copy()
