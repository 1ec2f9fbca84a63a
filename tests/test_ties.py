"""Tied fitness gets tied weights (strategies/base.py "Tied fitness"; strategies/cma_es.py "Ties").

The issue: with k/64 accuracies most candidates tie, and pycma ranks by argsort, so tied candidates
got unequal recombination weights by their place in the ask order. Measured with pycma 4.5.0 (D 4,
popsize 8, sigma 0.3, all eight tied at 0.5): the mean still moved a full selected step.
"""

import logging
import pickle

import cma
import numpy as np
import pytest

from strategies.base import average_over_ties
from strategies.cma_es import CMAES, SepCMAES, _GeneratorRandn, canonical_order, tie_weights
from strategies.lra_cma import LRACMAES
from strategies.openai_es import centred_ranks

TIE_AWARE = [CMAES, SepCMAES, LRACMAES]


def accuracy(genomes: np.ndarray, n: int = 8) -> np.ndarray:
    """(P, D) -> (P,): a k/n 'accuracy' that rises toward x = 1; coarse, so most candidates tie."""
    return np.floor(n * np.exp(-0.1 * np.sum((genomes - 1.0) ** 2, axis=1))) / n


def distribution(strategy) -> tuple[np.ndarray, float, np.ndarray]:
    """(mean, sigma, covariance factor) of a CMA-type strategy, the library's own arrays."""
    if isinstance(strategy, LRACMAES):
        return strategy.mean, strategy.sigma, strategy.cma._C.copy()
    es = strategy.es
    return strategy.mean, strategy.sigma, np.array(es.sm.C if not strategy.diagonal else es.sigma_vec.scaling)


# --- the weight rule -------------------------------------------------------------------------

W = np.array([0.5, 0.3, 0.2, -0.1, -0.3, -0.6])  # mu = 3 positive (sum 1), three negative (active)


@pytest.mark.parametrize(
    "values, expected, mu",
    [
        ([1, 2, 3, 4, 5, 6], W, 3),                                        # no ties: unchanged
        ([1, 1, 3, 4, 5, 6], [0.4, 0.4, 0.2, -0.1, -0.3, -0.6], 3),        # tie among the positive ranks
        ([1, 2, 3, 4, 6, 6], [0.5, 0.3, 0.2, -0.1, -0.45, -0.45], 3),      # tie among the negative ranks
        ([1, 2, 3, 3, 5, 6], [0.5, 0.3, 0.1, 0.1, -0.3, -0.6], 4),         # straddles mu: 0.2 shared, -0.1 dropped
        ([1, 2, 2, 2, 2, 6], [0.5, 0.125, 0.125, 0.125, 0.125, -0.6], 5),  # straddles: 0.5 shared by 4, -0.4 dropped
        ([7, 7, 7, 7, 7, 7], [1 / 6] * 6, 6),                              # all tied: the candidates' average
    ],
)
def test_tie_weights(values, expected, mu):
    w, mu_tied = tie_weights(W, 3, np.array(values, dtype=float))
    assert np.allclose(w, expected) and mu_tied == mu
    assert np.isclose(w[:mu_tied].sum(), 1.0) and np.all(np.diff(w) <= 1e-15)  # mean weights sum to 1, order kept
    assert -w[w < 0].sum() <= -W[W < 0].sum() + 1e-15  # negative mass never grows: pycma's pos.-def. bound holds


def test_average_over_ties_and_centred_ranks():
    assert np.array_equal(average_over_ties(np.array([1.0, 1.0, 2.0]), np.array([3.0, 1.0, 5.0])), [2.0, 2.0, 5.0])
    assert np.array_equal(centred_ranks(np.array([0.5, 0.25, 0.5, 1.0])), [0.0, -0.5, 0.0, 0.5])  # ranks 1.5, 0, 1.5, 3


def test_canonical_order_ignores_the_told_order():
    rng = np.random.default_rng(0)
    genomes, values = rng.normal(size=(8, 3)), np.array([2.0, 1, 1, 3, 1, 2, 0, 3])
    order = canonical_order(genomes, values)
    perm = rng.permutation(8)
    assert np.array_equal(genomes[order], genomes[perm][canonical_order(genomes[perm], values[perm])])
    assert np.all(np.diff(values[order]) >= 0)


# --- the strategies ----------------------------------------------------------------------------


@pytest.mark.parametrize("cls", TIE_AWARE)
def test_told_order_of_tied_candidates_does_not_matter(cls):
    """The same genomes and tied fitness told in another order give the identical update, bit for bit."""
    results = {}
    for ties in ("average", "argsort"):
        a, b = (cls(dim=4, x0=None, seed=3, population_size=8, sigma0=0.3, ties=ties) for _ in range(2))
        genomes = a.ask()
        assert np.array_equal(genomes, b.ask())
        fitness = np.array([0.5, 0.25, 0.5, 0.5, 0.75, 0.25, 0.5, 0.0])  # groups of 4, 2, 1, 1
        perm = np.array([3, 5, 2, 0, 4, 1, 7, 6])  # moves tied candidates to other places
        a.tell(genomes, fitness)
        b.tell(genomes[perm], fitness[perm])
        (ma, sa, ca), (mb, sb, cb) = distribution(a), distribution(b)
        same_next_ask = np.array_equal(a.ask(), b.ask())
        results[ties] = np.array_equal(ma, mb) and sa == sb and np.array_equal(ca, cb) and same_next_ask
    # argsort: the place in the order decides the weight; pycma's strategies take the place in ask's order
    # (the tell is put back into it: TPA's pair and injected solutions are read by place), the others the told one
    assert results == {"average": True, "argsort": issubclass(cls, CMAES)}


def test_tpa_pair_keeps_its_places_and_the_rest_is_order_free():
    """D >= 300: pycma's TPA reads its mirrored pair from places 0 and 1; the others may be permuted."""
    a, b = (CMAES(dim=300, x0=None, seed=1, population_size=8, sigma0=0.3) for _ in range(2))
    for _ in range(3):
        genomes = a.ask()
        assert a.es.mean_shift_samples and np.array_equal(genomes, b.ask())
        fitness = accuracy(genomes, n=2)
        perm = np.r_[0, 1, 2 + np.random.default_rng(0).permutation(6)]
        a.tell(genomes, fitness)
        b.tell(genomes[perm], fitness[perm])
        assert np.array_equal(a.mean, b.mean) and a.sigma == b.sigma


@pytest.mark.parametrize("name", ["cma_es", "sep_cma", "lra_cma", "openai_es"])
@pytest.mark.parametrize("ties", ["average", "argsort"])
def test_issue_measurement_all_tied_generation_moves_nothing(name, ties, caplog):
    """Issue 40's case: D 4, popsize 8, sigma 0.3, all tied at 0.5. Before, the mean moved to the candidates'
    average (cma_es, sep_cma: 0.21 rms over 200 seeds; lra_cma 0.91 of it) and sigma changed; now a fully
    tied generation leaves mean and sigma exactly where they were, for 50 seeds, and says so in the log."""
    from strategies import REGISTRY

    options = {} if name == "openai_es" else {"ties": ties}
    for seed in range(50):
        strategy = REGISTRY[name](dim=4, x0=None, seed=seed, population_size=8, sigma0=0.3, **options)
        strategy.tell(strategy.ask(), np.full(8, 0.5))  # generation 0: the mean is x0 = 0
        mean, sigma = strategy.mean, strategy.sigma
        with caplog.at_level(logging.INFO, logger="essa.strategies"):
            strategy.tell(strategy.ask(), np.full(8, 0.0))
        assert np.array_equal(strategy.mean, mean) and np.array_equal(mean, np.zeros(4)) and strategy.sigma == sigma
        assert strategy.tied and strategy.generation == 2
    assert "generation 1: all 8 candidates tied at fitness 0; the search distribution is left as it is" in caplog.text


@pytest.mark.parametrize("cls", TIE_AWARE)
def test_no_ties_same_as_argsort(cls):
    a, b = (cls(dim=5, x0=None, seed=2, population_size=8, sigma0=0.3, ties=ties) for ties in ("average", "argsort"))
    for _ in range(5):
        genomes = a.ask()
        assert np.array_equal(genomes, b.ask())
        fitness = -np.sum((genomes - 1.0) ** 2, axis=1)  # continuous: no ties
        a.tell(genomes, fitness)
        b.tell(genomes, fitness)
    assert np.array_equal(a.mean, b.mean) and a.sigma == b.sigma


def test_no_ties_identical_to_plain_pycma():
    """CMAES with ties=average and distinct fitness is pycma's own ask/tell, bit for bit."""
    strategy = CMAES(dim=5, x0=None, seed=4, population_size=8, sigma0=0.3)
    es = cma.CMAEvolutionStrategy(np.zeros(5), 0.3, {"popsize": 8, "verbose": -9, "verb_disp": 0, "verb_log": 0,
                                                     "randn": _GeneratorRandn(np.random.default_rng(4)),
                                                     "seed": np.nan, "CMA_diagonal": False})
    for _ in range(5):
        genomes = strategy.ask()
        assert np.array_equal(genomes, np.asarray(es.ask()))
        fitness = -np.sum((genomes - 1.0) ** 2, axis=1)
        strategy.tell(genomes, fitness)
        es.tell(list(genomes), list(-fitness))
    assert np.array_equal(strategy.mean, es.mean) and strategy.sigma == es.sigma and np.array_equal(strategy.es.C, es.C)


@pytest.mark.parametrize("cls", TIE_AWARE)
def test_resume_after_tie_averaged_tells_is_exact(cls):
    def run(strategy, generations):
        asked = []
        for _ in range(generations):
            genomes = strategy.ask()
            strategy.tell(genomes, accuracy(genomes))  # ties in every generation
            asked.append(genomes)
        return asked

    original = cls(dim=6, x0=None, seed=5, population_size=8, sigma0=0.5)
    run(original, 3)
    state = pickle.loads(pickle.dumps(original.state_dict()))
    resumed = cls(dim=6, x0=None, seed=5, population_size=8, sigma0=0.5)
    resumed.load_state_dict(state)
    for a, b in zip(run(original, 3), run(resumed, 3)):
        assert np.array_equal(a, b)
    assert np.array_equal(original.mean, resumed.mean) and original.sigma == resumed.sigma
    fresh = cls(dim=6, x0=None, seed=5, population_size=8, sigma0=0.5)  # the library's weights are back
    if isinstance(original, LRACMAES):
        assert np.array_equal(original.cma._weights, fresh.cma._weights) and original.cma._mu == fresh.cma._mu
    else:
        weights = original.es.sp.weights
        assert type(weights) is type(fresh.es.sp.weights) and list(weights) == list(fresh.es.sp.weights)
        assert weights.mu == fresh.es.sp.weights.mu


@pytest.mark.parametrize("cls", TIE_AWARE)
def test_ties_option_validated_in_one_line(cls):
    with pytest.raises(ValueError,
                       match=r"^strategy\.options\.ties must be 'average' or 'argsort' \(got 'mean'\)") as e:
        cls(dim=4, x0=None, seed=0, population_size=8, sigma0=0.3, ties="mean")
    assert "\n" not in str(e.value)


def test_ties_average_refuses_order_dependent_pycma_options():
    with pytest.raises(ValueError, match="ties=average cannot be combined with pycma's CMA_elitist"):
        CMAES(dim=4, x0=None, seed=0, population_size=8, sigma0=0.3, cma_options={"CMA_elitist": True})
    CMAES(dim=4, x0=None, seed=0, population_size=8, sigma0=0.3, cma_options={"CMA_elitist": True}, ties="argsort")
