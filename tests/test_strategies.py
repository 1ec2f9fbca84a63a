"""Contract tests for every registered strategy, plus the plugin registry (evosax-style)."""

import pickle
from pathlib import Path

import numpy as np
import pytest

import strategies
from strategies import REGISTRY, Strategy, get_strategy, rank_nan_last
from strategies.cma_es import CMAES, SepCMAES

PLUGIN_DIR = Path(__file__).parent / "plugin_example"
D, P = 10, 10
BUILTINS = "cma_es, corp, essa, guided_cma, lra_cma, mezo_gv, nevergrad, openai_es, random_baseline, randopt, scale_baseline, sep_cma"
# openai_es keeps sigma = sigma0, so its asked population keeps D sigma0^2 = 2.5 of squared error and
# cannot get 10x better: only its mean is judged. LRA-CMA-ES starts its signal-to-noise averages at
# zero, so its learning rates fall from 1 to ~0.25 in the first generations and sigma is scaled up by
# the same factor (arXiv 2304.03473, Algorithm 1's step-size correction; sigma 0.5 -> 1.05 at
# generation 30): it meets the same bar in 100 generations (population -0.36 at seed 0; 30: -14.5).
# randopt, mezo_gv, corp and random_baseline sample at a fixed sigma too. random_baseline never re-centres (the
# skeptic's baseline): its best of 300 random genomes only has to beat the start (squared error 10). mezo_gv
# steps lr (mean(best 2) - mean(worst 2)) / 2 at a fixed sigma and lr: near the optimum that step is noise of
# about sigma sqrt(D / 2) / 2 = 0.8 in norm, so its mean keeps a squared error near 1.
SPREAD_KEPT = {"openai_es", "randopt", "mezo_gv", "random_baseline", "corp"}
MEAN_BAR = {"random_baseline": -8.0, "mezo_gv": -2.0}  # else -0.5
NO_SET_MEAN = {"nevergrad"}  # a Nevergrad optimizer's centre is its own: strategy.mean_decay is refused
SPHERE_GENERATIONS = {"lra_cma": 100}


def sphere(genomes: np.ndarray) -> np.ndarray:
    """(P, D) -> (P,): -||x - 1||^2, maximised at x = 1."""
    return -np.sum((genomes - 1.0) ** 2, axis=1)


def make(cls: type[Strategy], seed: int = 0, **options) -> Strategy:
    return cls(dim=D, x0=None, seed=seed, population_size=P, sigma0=0.5, **options)


def run(strategy: Strategy, generations: int) -> list[np.ndarray]:
    asked = []
    for _ in range(generations):
        genomes = strategy.ask()
        strategy.tell(genomes, sphere(genomes))
        asked.append(genomes)
    return asked


@pytest.fixture
def plugin_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))


# --- contract, every registry entry ---------------------------------------------------


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_sphere_improves(name):
    strategy = make(REGISTRY[name])
    first = sphere(strategy.ask()).mean()  # about -D - D sigma^2 = -12.5
    generations = SPHERE_GENERATIONS.get(name, 30)
    run(strategy, generations)
    last = sphere(strategy.ask()).mean()
    if name not in SPREAD_KEPT:
        assert last > 0.1 * first, (first, last)  # squared error down by 10x or more
    assert sphere(strategy.mean[None])[0] > MEAN_BAR.get(name, -0.5)  # the mean's squared error down from 10
    assert strategy.generation == generations
    assert strategy.best_fitness > MEAN_BAR.get(name, -1.0) and strategy.best_genome.shape == (D,)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_ask_shape_dtype_and_properties(name):
    strategy = make(REGISTRY[name])
    genomes = strategy.ask()
    assert genomes.shape == (P, D) and genomes.dtype == np.float64
    assert strategy.population_size == P and strategy.generation == 0
    assert strategy.sigma == pytest.approx(0.5)
    assert strategy.mean.shape == (D,) and np.array_equal(strategy.mean, np.zeros(D))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_nan_ranked_last(name):
    """NaN candidates update the strategy exactly as the worst finite candidates would."""
    with_nan, with_low = make(REGISTRY[name]), make(REGISTRY[name])
    genomes = with_nan.ask()
    assert np.array_equal(genomes, with_low.ask())
    fitness = sphere(genomes)
    best = np.argsort(fitness)[-3:]  # fail the three best: they must not pull the mean
    nan_fitness, low_fitness = fitness.copy(), fitness.copy()
    nan_fitness[best] = np.nan
    # failed candidates all tie below every finite one (rank_nan_last), and tied fitness gets tied
    # weights; so the reference gives the three the same low value: both tells rank them alike
    low_fitness[best] = fitness.min() - 100.0
    with_nan.tell(genomes, nan_fitness)
    with_low.tell(genomes, low_fitness)
    assert np.allclose(with_nan.mean, with_low.mean) and with_nan.sigma == pytest.approx(with_low.sigma)
    assert np.array_equal(with_nan.ask(), with_low.ask())  # covariance too: the same ranks, the same update
    assert with_nan.best_fitness == np.nanmax(nan_fitness)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_exact_resume(name):
    """3 generations, checkpoint, 2 more == fresh object loaded at generation 3, 2 more."""
    original = make(REGISTRY[name], seed=7)
    run(original, 3)
    state = pickle.loads(pickle.dumps(original.state_dict()))
    continued = run(original, 2)
    resumed = make(REGISTRY[name], seed=7)
    resumed.load_state_dict(state)
    assert resumed.generation == 3
    for a, b in zip(continued, run(resumed, 2)):
        assert np.array_equal(a, b)
    assert np.array_equal(original.mean, resumed.mean) and original.sigma == resumed.sigma
    again = make(REGISTRY[name], seed=7)  # a resumed strategy checkpoints and resumes too
    again.load_state_dict(pickle.loads(pickle.dumps(resumed.state_dict())))
    assert np.array_equal(run(original, 1)[0], run(again, 1)[0])


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_global_numpy_rng_untouched(name):
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    run(make(REGISTRY[name]), 2)
    assert np.array_equal(np.random.get_state()[1], before)


def test_seeds_differ_and_repeat():
    a, b, c = make(CMAES, seed=1).ask(), make(CMAES, seed=1).ask(), make(CMAES, seed=2).ask()
    assert np.array_equal(a, b) and not np.array_equal(a, c)


# --- validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(population_size=1), "strategy.population_size must be >= 2"),  # too small
        (dict(sigma0=0.0), "strategy.sigma0"),  # zero step size
        (dict(sigma0=float("nan")), "strategy.sigma0"),  # NaN step size
        (dict(x0=np.zeros(D + 1)), r"x0 has shape \(11,\), expected \(10,\)"),  # wrong length
        (dict(dim=0), "dim must be an integer >= 1"),  # empty genome
        (dict(mirrored=True), "unknown option"),  # option no strategy knows
        (dict(diagonal="yes"), "strategy.options.diagonal"),  # not a bool
        (dict(cma_options={"popsize": 5}), "may not set popsize"),  # reserved pycma option
    ],
)
def test_bad_arguments(kwargs, match):
    args = dict(dim=D, x0=None, seed=0, population_size=P, sigma0=0.5) | kwargs
    with pytest.raises(ValueError, match=match):
        CMAES(**args)


def test_tell_validation():
    strategy = make(CMAES)
    genomes = strategy.ask()
    with pytest.raises(ValueError, match=r"genomes have shape \(9, 10\)"):
        strategy.tell(genomes[:-1], sphere(genomes)[:-1])
    with pytest.raises(ValueError, match=r"fitness has shape \(10, 1\)"):
        strategy.tell(genomes, sphere(genomes)[:, None])
    with pytest.raises(ValueError, match="all 10 fitness values are NaN"):
        strategy.tell(genomes, np.full(P, np.nan))
    with pytest.raises(ValueError, match=r"\+inf"):
        strategy.tell(genomes, np.r_[np.inf, sphere(genomes)[1:]])
    assert strategy.generation == 0


def test_rank_nan_last():
    assert np.array_equal(rank_nan_last(np.array([1.0, np.nan, 3.0, -np.inf])), [1.0, -2.0, 3.0, -2.0])
    assert np.array_equal(rank_nan_last(np.array([np.nan, np.nan])), [0.0, 0.0])
    assert np.array_equal(rank_nan_last(np.array([0.5, 0.5])), [0.5, 0.5])  # untouched, copied


def test_diagonal_auto_and_sep():
    assert not CMAES(dim=D, x0=None, seed=0, population_size=P, sigma0=1.0).diagonal
    assert CMAES(dim=2001, x0=None, seed=0, population_size=P, sigma0=1.0).diagonal
    assert SepCMAES(dim=D, x0=None, seed=0, population_size=P, sigma0=1.0).diagonal
    with pytest.raises(ValueError, match="sep_cma is always diagonal"):
        SepCMAES(dim=D, x0=None, seed=0, population_size=P, sigma0=1.0, diagonal=False)


def test_cma_options_pass_through():
    strategy = make(CMAES, cma_options={"CMA_active": False})
    assert strategy.es.opts["CMA_active"] is False


def test_load_state_dict_mismatch():
    state = make(CMAES).state_dict()
    with pytest.raises(ValueError, match="build it with the checkpoint's population_size"):
        CMAES(dim=D, x0=None, seed=0, population_size=P + 2, sigma0=0.5).load_state_dict(state)
    with pytest.raises(ValueError, match="state is for"):
        make(SepCMAES).load_state_dict(state)


# --- registry and plugins ---------------------------------------------------------------


def test_registry_builtins():
    assert get_strategy("cma_es") is CMAES and get_strategy("essa") is CMAES
    assert get_strategy("sep_cma") is SepCMAES
    assert get_strategy("strategies.cma_es.CMAES") is CMAES  # dotted path to a built-in


@pytest.mark.parametrize(
    "target, match",
    [
        ("nope", f"strategy 'nope' is not a known strategy; use one of: built-in {BUILTINS}"),  # no such name
        ("no_such_pkg.Strategy", "essa.strategies"),  # module missing: says how to register
        ("strategies.base.Nope", "has no attribute 'Nope'"),  # module exists, class missing
        ("numpy.ndarray", "not a subclass of strategies.Strategy"),  # not a strategy
    ],
)
def test_get_strategy_errors(target, match):
    with pytest.raises(ValueError, match=match):
        get_strategy(target)


def test_plugin_by_dotted_path(plugin_path):
    cls = get_strategy("essa_plugin_example.RandomSearch")
    assert issubclass(cls, Strategy) and cls.__name__ == "RandomSearch"
    strategy = cls(dim=D, x0=None, seed=0, population_size=P, sigma0=0.3)
    run(strategy, 20)
    assert strategy.best_fitness > sphere(np.zeros((1, D)))[0]


def test_plugin_by_entry_point(plugin_path, tmp_path, monkeypatch):
    dist = tmp_path / "essa_plugin_example-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: essa-plugin-example\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[essa.strategies]\nrandom_search = essa_plugin_example:RandomSearch\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = get_strategy("random_search")
    assert cls is get_strategy("essa_plugin_example.RandomSearch")
    with pytest.raises(ValueError, match=f"built-in {BUILTINS}; installed plugins random_search;"):
        get_strategy("nope")


def test_plugin_exact_resume(plugin_path):
    cls = get_strategy("essa_plugin_example.RandomSearch")
    original = cls(dim=D, x0=None, seed=3, population_size=P, sigma0=0.3)
    run(original, 3)
    state = pickle.loads(pickle.dumps(original.state_dict()))
    resumed = cls(dim=D, x0=None, seed=3, population_size=P, sigma0=0.3)
    resumed.load_state_dict(state)
    for a, b in zip(run(original, 2), run(resumed, 2)):
        assert np.array_equal(a, b)


def test_package_exports():
    assert set(strategies.__all__) >= {"REGISTRY", "Strategy", "get_strategy"}


@pytest.mark.parametrize("dim,diagonal", [(1920, False), (2000, False), (2001, True), (3584, True)])
def test_essa_config_goes_separable_above_the_documented_dim(dim, diagonal):
    # issue 16: strategy=essa was always full covariance; its checkpoint (C and eigenbasis B, 2 x D^2
    # float64) was 59 MB per generation at D 1920 and 206 MB at D 3584. Build it as the run loop does.
    from omegaconf import OmegaConf

    from strategies.cma_es import AUTO_DIAGONAL_DIM

    cfg = OmegaConf.load(Path(__file__).parent.parent / "conf" / "strategy" / "essa.yaml")
    cls = get_strategy(cfg.name)
    strategy = cls(dim=dim, x0=None, seed=0, population_size=cfg.population_size, sigma0=cfg.sigma0,
                   **OmegaConf.to_container(cfg.options))
    assert strategy.diagonal is diagonal and (dim > AUTO_DIAGONAL_DIM) is diagonal
    genomes = strategy.ask()
    strategy.tell(genomes, -np.square(genomes).sum(axis=1))
    size = len(pickle.dumps(strategy.state_dict(), protocol=4))
    full = 2 * 8 * dim ** 2                                            # C and B in float64
    if diagonal:
        assert size < 100 * 8 * dim                                    # linear in D: ~2 MB at 3584, not 206 MB
    else:
        assert full < size < 1.1 * full                                # ESSA's full covariance below the threshold


def test_full_covariance_refused_above_max_dim_in_one_line():
    from strategies.cma_es import MAX_FULL_DIM

    with pytest.raises(ValueError) as e:
        CMAES(dim=MAX_FULL_DIM + 1, x0=None, seed=0, population_size=P, sigma0=1.0, diagonal=False)
    msg = str(e.value)
    assert msg.startswith("strategy.options.diagonal=false") and "\n" not in msg and "diagonal=auto" in msg
    assert CMAES(dim=MAX_FULL_DIM + 1, x0=None, seed=0, population_size=P, sigma0=1.0).diagonal  # auto


# --- OpenAI-ES and LRA-CMA-ES specifics ---------------------------------------------------------


def test_openai_es_update_is_the_papers_estimate():
    """Mirrored pairs, centred ranks with ties averaged, mean += lr / (P sigma) sum_i u_i eps_i."""
    from strategies.openai_es import OpenAIES, centred_ranks

    strategy = OpenAIES(dim=D, x0=np.full(D, 0.2), seed=0, population_size=P, sigma0=0.5, lr=0.1)
    genomes = strategy.ask()
    eps = (genomes - 0.2) / 0.5
    assert np.allclose(eps[: P // 2], -eps[P // 2:])  # pairs i, i + P/2
    fitness = np.round(sphere(genomes))  # ties
    fitness[3] = fitness[7]
    strategy.tell(genomes, fitness)
    u = centred_ranks(fitness)
    assert u[3] == u[7] and u.min() >= -0.5 and u.max() <= 0.5
    assert np.allclose(strategy.mean, 0.2 + 0.1 * u @ eps / (P * 0.5))
    assert strategy.sigma == 0.5  # fixed


def test_openai_es_defaults_and_weight_decay():
    from strategies.openai_es import RANK_SIGNAL, OpenAIES

    sgd = OpenAIES(dim=D, x0=None, seed=0, population_size=16, sigma0=0.3)
    assert sgd.lr == pytest.approx(0.09 / (2 * RANK_SIGNAL)) and 0.15 < sgd.lr < 0.17
    assert OpenAIES(dim=D, x0=None, seed=0, population_size=16, sigma0=0.3, optimizer="adam").lr == pytest.approx(0.15)
    decayed, plain = (OpenAIES(dim=D, x0=np.ones(D), seed=0, population_size=P, sigma0=0.3, lr=0.1, weight_decay=wd)
                      for wd in (0.5, 0.0))
    genomes = decayed.ask()
    assert np.array_equal(genomes, plain.ask())
    for strategy in (decayed, plain):
        strategy.tell(genomes, sphere(genomes))
    assert np.allclose(decayed.mean - plain.mean, -0.1 * 0.5 * np.ones(D))  # the decay toward 0 (the SFT adapter)


def test_openai_es_adam_state_resumes_and_must_match():
    from strategies.openai_es import OpenAIES

    original = OpenAIES(dim=D, x0=None, seed=2, population_size=P, sigma0=0.5, optimizer="adam")
    run(original, 3)
    state = pickle.loads(pickle.dumps(original.state_dict()))
    assert state["strategy"]["adam_t"] == 3 and state["strategy"]["adam_m"].shape == (D,)
    resumed = OpenAIES(dim=D, x0=None, seed=2, population_size=P, sigma0=0.5, optimizer="adam")
    resumed.load_state_dict(state)
    for a, b in zip(run(original, 2), run(resumed, 2)):
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="build it with the checkpoint's optimizer"):
        OpenAIES(dim=D, x0=None, seed=2, population_size=P, sigma0=0.5).load_state_dict(state)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(population_size=9), r"^strategy\.population_size must be even for strategy=openai_es \(got 9\)"),
        (dict(optimizer="rmsprop"), r"^strategy\.options\.optimizer must be 'sgd' or 'adam'"),
        (dict(lr=0.0), r"^strategy\.options\.lr must be a finite number > 0"),
        (dict(lr="fast"), r"^strategy\.options\.lr"),
        (dict(weight_decay=-1.0), r"^strategy\.options\.weight_decay must be a finite number >= 0"),
    ],
)
def test_openai_es_bad_arguments_one_line(kwargs, match):
    from strategies.openai_es import OpenAIES

    with pytest.raises(ValueError, match=match) as e:
        OpenAIES(**(dict(dim=D, x0=None, seed=0, population_size=P, sigma0=0.5) | kwargs))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(population_size=3), r"^strategy\.population_size must be >= 4 for strategy=lra_cma \(got 3\)"),
        (dict(dim=2001), r"^strategy=lra_cma keeps full covariance .* D=2000 \(got D=2001\); use strategy=sep_cma"),
        (dict(ties=None), r"^strategy\.options\.ties must be"),
    ],
)
def test_lra_cma_bad_arguments_one_line(kwargs, match):
    from strategies.lra_cma import LRACMAES

    with pytest.raises(ValueError, match=match) as e:
        LRACMAES(**(dict(dim=D, x0=None, seed=0, population_size=P, sigma0=0.5) | kwargs))
    assert "\n" not in str(e.value)


def test_lra_cma_adapts_its_learning_rates():
    from strategies.lra_cma import LRACMAES

    strategy = make(LRACMAES)
    assert strategy.learning_rates == (1.0, 1.0)
    run(strategy, 10)
    eta_mean, eta_sigma = strategy.learning_rates
    assert 0 < eta_mean < 1 and 0 < eta_sigma < 1  # the SNR estimates start low: the rates fall at first


@pytest.mark.parametrize("config", ["lra_cma", "openai_es"])
def test_new_strategy_configs_build_as_the_run_loop_does(config):
    """conf/strategy/<name>.yaml composes into the class with its options, at ESSA's D 240."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(Path(__file__).parent.parent / "conf" / "strategy" / f"{config}.yaml")
    assert cfg.genome.kind == "svd_lora" and cfg.genome.alpha == 0.125 and cfg.sigma0 == 0.3
    cls = get_strategy(cfg.name)
    strategy = cls(dim=240, x0=None, seed=0, population_size=cfg.population_size, sigma0=cfg.sigma0,
                   **OmegaConf.to_container(cfg.options))
    genomes = strategy.ask()
    assert genomes.shape == (16, 240)
    strategy.tell(genomes, np.floor(8 * np.exp(-np.square(genomes).sum(axis=1))) / 8)  # k/8 accuracies: ties
    assert np.all(np.isfinite(strategy.mean)) and len(pickle.dumps(strategy.state_dict())) < 2e6


def test_lra_cma_state_keeps_c_whole_and_draws_from_the_saved_generator():
    """cmaes's own pickle drops its RandomState and keeps C's upper triangle (inexact once an ask has
    rebuilt C = B diag(D^2) B^T); the adapter's state keeps every other attribute as it is."""
    from strategies.lra_cma import LRACMAES

    strategy = make(LRACMAES, seed=1)
    run(strategy, 2)
    strategy.ask()  # C rebuilt from its eigen-decomposition
    cma_state = pickle.loads(pickle.dumps(strategy.state_dict()))["strategy"]["cma"]
    assert "_rng" not in cma_state and np.array_equal(cma_state["_C"], strategy.cma._C)
    assert set(cma_state) == set(vars(strategy.cma)) - {"_rng"}
    resumed = make(LRACMAES, seed=1)
    resumed.load_state_dict(pickle.loads(pickle.dumps(strategy.state_dict())))
    assert resumed.cma._rng.rng is resumed.rng  # cmaes samples from the generator the base class restored
    assert resumed.rng.bit_generator.state == strategy.rng.bit_generator.state
    genomes = strategy.ask()
    assert np.array_equal(genomes, resumed.ask())


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_shrink_mean_pulls_toward_x0_and_resumes(name):
    """strategy.mean_decay's anchored decay: mean <- x0 + f (mean - x0), kept by state_dict."""
    x0 = np.linspace(-1, 1, D)
    s = REGISTRY[name](dim=D, x0=x0, seed=0, population_size=P, sigma0=0.5)
    genomes = s.ask()
    s.tell(genomes, sphere(genomes))
    before = s.mean
    if name in NO_SET_MEAN:
        with pytest.raises(NotImplementedError, match="strategy.mean_decay=0"):
            s.shrink_mean(0.5)
        return
    s.shrink_mean(0.5)
    np.testing.assert_allclose(s.mean, x0 + 0.5 * (before - x0), atol=1e-12)
    copy = REGISTRY[name](dim=D, x0=x0, seed=0, population_size=P, sigma0=0.5)
    copy.load_state_dict(pickle.loads(pickle.dumps(s.state_dict())))
    assert np.array_equal(copy.ask(), s.ask())  # the decayed mean is what the next ask samples around
    with pytest.raises(ValueError, match="mean_decay"):
        s.shrink_mean(1.5)
