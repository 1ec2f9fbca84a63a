"""strategies.testing: every registered strategy passes the contract checks, and each of eight
deliberately broken strategies is caught by the check for its fault, with a one-line message."""

import sys
from pathlib import Path

import numpy as np
import pytest

from strategies import REGISTRY, Strategy
from strategies.openai_es import centred_ranks
from strategies.testing import (CHECKS, check_ask, check_memory, check_nan_last, check_no_mutation, check_resume,
                                check_seed, check_strategy, check_ties, format_memory)

PLUGIN_DIR = Path(__file__).parent / "plugin_example"


class MeanOfBetterHalf(Strategy):
    """A correct minimal strategy: N(mean, sigma0^2 I), the mean moves to the rank-weighted better half."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._mean = self.x0.copy()

    def _noise(self) -> np.ndarray:
        return self.rng.standard_normal((self.population_size, self.dim))

    def _ask(self):
        return self._mean + self.sigma0 * self._noise()

    def _tell(self, genomes, fitness):
        w = np.maximum(centred_ranks(fitness), 0.0)  # tied fitness, tied weights
        self._mean = w @ genomes / w.sum()

    @property
    def sigma(self):
        return self.sigma0

    @property
    def mean(self):
        return self._mean.copy()

    def _state_dict(self):
        return {"mean": self._mean.copy()}

    def _load_state_dict(self, state):
        self._mean = state["mean"].copy()


class UsesGlobalRandom(MeanOfBetterHalf):
    """(a) ignores its seed: numpy's global generator."""

    def _noise(self):
        return np.random.standard_normal((self.population_size, self.dim))


class UnseededGenerator(MeanOfBetterHalf):
    """(a') ignores its seed: an unseeded default_rng()."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.noise_rng = np.random.default_rng()

    def _noise(self):
        return self.noise_rng.standard_normal((self.population_size, self.dim))


class ForgetsGenerator(MeanOfBetterHalf):
    """(b) a second, seeded generator that state_dict does not save."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.noise_rng = np.random.default_rng(self.seed + 1)

    def _noise(self):
        return self.noise_rng.standard_normal((self.population_size, self.dim))


class CrashesOnNaN(MeanOfBetterHalf):
    """(c) overrides tell and reads the raw fitness before the base class ranks NaN last."""

    def tell(self, genomes, fitness):
        self.best_bucket = int(np.max(fitness) * 4)  # int(nan): ValueError
        super().tell(genomes, fitness)


class WrongShape(MeanOfBetterHalf):
    """(d) _ask returns one column too many: the base class's ask raises RuntimeError."""

    def _ask(self):
        return np.zeros((self.population_size, self.dim + 1))


class WrongShapeOverride(MeanOfBetterHalf):
    """(d') overrides ask itself (past the base class's shape check) and drops the last column."""

    def ask(self):
        return self._ask()[:, :-1].copy()


class WritesIntoGenomes(MeanOfBetterHalf):
    """(e) centres the genomes it is told in place."""

    def _tell(self, genomes, fitness):
        genomes -= self._mean
        w = np.maximum(centred_ranks(fitness), 0.0)
        self._mean = self._mean + w @ genomes / w.sum()


class SortsFitness(MeanOfBetterHalf):
    """(e') sorts the fitness it is told in place."""

    def tell(self, genomes, fitness):
        fitness.sort()
        super().tell(genomes, fitness)


class BreaksTiesByOrder(MeanOfBetterHalf):
    """(f) a fully tied generation still moves it: ties broken by the ask order."""

    def tell(self, genomes, fitness):
        if np.all(fitness == fitness[0]):
            fitness = fitness + 1e-9 * np.arange(len(fitness))
        super().tell(genomes, fitness)


class WeighsByValue(MeanOfBetterHalf):
    """(f') weights candidates by their fitness values, not their ranks (softmax)."""

    def _tell(self, genomes, fitness):
        w = np.exp(fitness - fitness.max())
        self._mean = w @ genomes / w.sum()


class _Box:
    """A project class (this test module's) that PicklesOwnClass hides in its state's bytes."""

    def __init__(self, mean):
        self.mean = mean


class PicklesOwnClass(MeanOfBetterHalf):
    """(g) its state holds a pickle naming its own package's class (as pycma's pickle once held
    strategies.cma_es._GeneratorRandn): moving that module would break every checkpoint."""

    def _state_dict(self):
        import pickle
        return {"box": pickle.dumps(_Box(self._mean.copy()))}

    def _load_state_dict(self, state):
        import pickle
        self._mean = pickle.loads(state["box"]).mean


BROKEN = [
    (UsesGlobalRandom, check_seed, "global random state|asked different candidates"),
    (UnseededGenerator, check_seed, "asked different candidates"),
    (ForgetsGenerator, check_resume, "after load_state_dict differs"),
    (CrashesOnNaN, check_nan_last, "tell\\(\\) raised ValueError: cannot convert float NaN to integer"),
    (WrongShape, check_ask, "ask\\(\\) raised RuntimeError: WrongShape._ask returned shape \\(8, 9\\)"),
    (WrongShapeOverride, check_ask, "ask\\(\\) returned shape \\(8, 7\\) dtype float64, expected \\(8, 8\\) float64"),
    (WritesIntoGenomes, check_no_mutation, "tell\\(\\) changed the genomes"),
    (SortsFitness, check_no_mutation, "tell\\(\\) changed the fitness"),
    (BreaksTiesByOrder, check_ties, "a fully tied tell moved the mean"),
    (WeighsByValue, check_ties, "a partly tied tell moved the strategy by more than the ranks"),
    (PicklesOwnClass, check_resume, "state_dict\\(\\) names .*_Box .*moving or renaming"),
]


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_registered_strategies_conform(name, check):
    check(REGISTRY[name])


def test_reference_strategy_conforms():
    check_strategy(MeanOfBetterHalf, verbose=False)


@pytest.mark.parametrize("cls, check, seen", BROKEN, ids=[b[0].__name__ for b in BROKEN])
def test_broken_strategy_caught_by_its_check(cls, check, seen):
    with pytest.raises(AssertionError, match=f"^{check.__name__}: .*({seen})") as e:
        check(cls)
    assert "\n" not in str(e.value)
    with pytest.raises(AssertionError, match=f"^{check.__name__}: "):  # and it is the first check to fail
        check_strategy(cls, verbose=False)


def test_memory_report_and_limit(capsys):
    report = check_memory(REGISTRY["openai_es"])
    assert report["dim"] == 8192 and 0 < report["state_mb"] < 1 and 0 < report["peak_mb"] < 10
    with pytest.raises(AssertionError, match=r"^check_memory: peak_mb [0-9.]+ at D 8192, P 4 is above the limit 0.001"):
        check_memory(REGISTRY["openai_es"], max_peak_mb=0.001)
    refused = check_memory(REGISTRY["lra_cma"])  # full covariance: refused above D 2000, in one line
    assert refused["refused"].startswith("strategy=lra_cma keeps full covariance")
    assert "refuses D 8192" in format_memory(refused)
    check_strategy(REGISTRY["sep_cma"])
    assert capsys.readouterr().out.startswith("SepCMAES: D 8192, P 4: state_dict")


def test_plugin_example_conforms(monkeypatch):
    """The README's plugin passes the checks, as its own tests/plugin_example/test_conformance.py runs them."""
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    monkeypatch.delitem(sys.modules, "essa_plugin_example", raising=False)
    from essa_plugin_example import RandomSearch

    report = check_strategy(RandomSearch, verbose=False)
    assert report["state_mb"] < 1
