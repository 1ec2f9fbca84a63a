"""A third-party strategy in one file: Gaussian random search around the best genome so far.

Installed as a package (``pip install tests/plugin_example``, see its pyproject.toml), it is the
group option ``strategy=random_search`` with the settings in ``RandomSearch.config``; by dotted path
it needs no install at all (``strategy._target_=essa_plugin_example.RandomSearch ~strategy.options.diagonal``
when the module is importable). The entry point in the plugin's own pyproject.toml::

    [project.entry-points."essa.strategies"]
    random_search = "essa_plugin_example:RandomSearch"

``test_conformance.py`` beside this file runs essa's contract checks (``strategies.testing``) on
it; a plugin copies that test and names its own class.
"""
from typing import ClassVar

import numpy as np

from strategies import Strategy


class RandomSearch(Strategy):
    """Sample N(best so far, sigma0^2 I); the base class tracks the best and saves the RNG.

    Pure random search around the incumbent (Rastrigin, "The convergence of the random search
    method in the extremal control of a many parameter system", 1963): the simplest baseline,
    with no state beyond what :class:`strategies.Strategy` keeps (``self.rng``, the best genome).
    Its only randomness is ``self.rng``, so it resumes exactly; NaN fitness never becomes the best.
    """

    # The `strategy=random_search` config group option (fields of engine.config.StrategyConfig); the fields
    # it leaves out (genome.mode) are strategy=essa's: the relative genome of alpha 0.5, D 960 at rank 8.
    config: ClassVar[dict] = {"population_size": 8, "sigma0": 0.05, "options": {},
                              "genome": {"kind": "svd_lora", "alpha": 0.5}}

    def _ask(self) -> np.ndarray:
        """(P, D) float64: the best genome so far (x0 before the first tell) plus sigma0 noise."""
        noise = self.rng.standard_normal((self.population_size, self.dim))  # (P, D)
        return self.mean + self.sigma0 * noise

    def _tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        pass  # nothing to learn beyond the best genome, which the base class keeps

    @property
    def sigma(self) -> float:
        """The fixed sampling standard deviation, sigma0."""
        return self.sigma0

    @property
    def mean(self) -> np.ndarray:
        """(D,) float64 copy of the best genome so far (x0 before the first tell)."""
        return (self.x0 if self.best_genome is None else self.best_genome).copy()
