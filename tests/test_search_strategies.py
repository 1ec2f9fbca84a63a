"""The search strategies of issue 39 (strategies/randopt.py, mezo_gv.py, guided_cma.py, nevergrad_bridge.py,
baselines.py): their maths, their configs, their one-line option errors and the contract of
strategies.testing with the options their configs set."""

import pickle
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from strategies import REGISTRY, get_strategy
from strategies.baselines import RandomSearch, ScaleSearch, fit_scale
from strategies.corp import CoRP, compatible_direction
from strategies.guided_cma import GuidedCMAES, ridge_direction
from strategies.mezo_gv import MeZOGV
from strategies.nevergrad_bridge import PICKLE_MODULES, NevergradStrategy
from strategies.perturb import selection_weights
from strategies.randopt import RandOpt
from strategies.testing import check_strategy

CONF = Path(__file__).parent.parent / "conf" / "strategy"
NEW = ["randopt", "mezo_gv", "corp", "guided_cma", "nevergrad", "random_baseline", "scale_baseline"]


def build(cls, dim=6, population_size=8, sigma0=0.3, seed=0, **options):
    return cls(dim=dim, x0=None, seed=seed, population_size=population_size, sigma0=sigma0, **options)


# --- selection weights: tied fitness, tied weights --------------------------------------------


@pytest.mark.parametrize(
    "fitness, top, bottom, expected",
    [
        ([4, 3, 2, 1], 1, 0, [1, 0, 0, 0]),                       # the best alone
        ([1, 4, 2, 3], 2, 0, [0, 0.5, 0, 0.5]),                   # any order: the two best
        ([4, 3, 3, 1], 2, 0, [0.5, 0.25, 0.25, 0]),               # a tie straddling K shares the K-th weight
        ([4, 3, 2, 1], 1, 1, [1, 0, 0, -1]),                      # best minus worst
        ([2, 2, 2, 2], 1, 1, [0, 0, 0, 0]),                       # all tied: no direction at all
        ([5, 1, 1, 3], 1, 1, [1, -0.5, -0.5, 0]),                 # the worst group's tie shares -1
    ],
)
def test_selection_weights(fitness, top, bottom, expected):
    assert np.allclose(selection_weights(np.array(fitness, dtype=float), top, bottom), expected)


# --- the updates --------------------------------------------------------------------------------


def test_randopt_moves_the_centre_onto_the_top_k_average():
    s = build(RandOpt, top_k=3)
    genomes = s.ask()
    fitness = -np.arange(8.0)  # candidate 0 best
    s.tell(genomes, fitness)
    assert np.allclose(s.mean, genomes[:3].mean(axis=0))
    half = build(RandOpt, top_k=3, lr=0.5)
    half.tell(half.ask(), fitness)
    assert np.allclose(half.mean, 0.5 * genomes[:3].mean(axis=0))  # lr 0.5: half way from x0 = 0
    assert np.allclose(s.ask().std(), 0.3, rtol=0.3)  # sigma stays sigma0


def test_mezo_gv_steps_along_best_minus_worst():
    s = build(MeZOGV, group=2)
    genomes = s.ask()
    assert np.allclose(genomes[:4], -genomes[4:])  # mirrored pairs around x0 = 0
    fitness = genomes[:, 0]  # rank by the first coordinate
    s.tell(genomes, fitness)
    order = np.argsort(-fitness)
    expected = 0.5 * (genomes[order[:2]].mean(axis=0) - genomes[order[-2:]].mean(axis=0))
    assert np.allclose(s.mean, expected) and s.mean[0] > 0


def test_corp_direction_drops_the_candidates_that_disagree():
    """Compatibility weights: a perturbation whose signed direction points against the reward-weighted
    direction gets weight 0; the rest are weighted by their centred rank."""
    eps = np.array([[1.0, 0.0], [0.9, 0.1], [-1.0, 0.0], [0.5, 0.0], [-0.2, -1.0]])
    fitness = np.array([5.0, 4.0, 1.0, 0.0, 3.0])  # eps_3 is the worst yet points along the others' direction
    a = np.array([0.5, 0.25, -0.25, -0.5, 0.0])  # centred ranks
    d0 = a @ eps
    w = a * np.maximum(0, np.sign(a) * (eps @ d0) / (np.linalg.norm(eps, axis=1) * np.linalg.norm(d0)))
    assert w[3] == 0 and w[4] == 0 and w[2] < 0 and w[0] > 0  # -eps_2 agrees with d0, -eps_3 does not
    assert np.allclose(compatible_direction(eps, fitness), w @ eps / np.abs(w).sum())
    assert not compatible_direction(eps, np.ones(5)).any()  # all tied: no direction


def test_corp_gate_commits_only_a_proposal_that_beats_the_centre():
    s = build(CoRP, population_size=8)
    first = s.ask()
    assert np.allclose(first[:4], -first[4:])  # no proposal yet: 4 mirrored pairs around x0 = 0
    s.tell(first, first[:, 0])
    proposal = s.state_dict()["strategy"]["proposal"]
    assert proposal[0] > 0 and np.array_equal(s.mean, np.zeros(6))  # pending, not committed
    second = s.ask()
    assert np.array_equal(second[0], proposal) and np.array_equal(second[1], np.zeros(6))
    assert np.allclose(second[2:5] - second[1], -(second[5:] - second[1]))  # 3 mirrored pairs
    worse = second[:, 0].copy()
    worse[0] = worse[1]  # a tie at the gate keeps the centre
    s.tell(second, worse)
    assert np.array_equal(s.mean, np.zeros(6)) and (s.commits, s.gates) == (0, 1)
    third = s.ask()
    better = third[:, 0].copy()
    better[0] = better[1] + 1.0
    s.tell(third, better)
    assert np.array_equal(s.mean, third[0]) and (s.commits, s.gates) == (1, 2)
    ungated = build(CoRP, population_size=8, gate=False)
    genomes = ungated.ask()
    ungated.tell(genomes, genomes[:, 0])
    assert ungated.mean[0] > 0 and ungated.state_dict()["strategy"]["proposal"] is None
    assert ungated.ask().shape == (8, 6)  # no gate candidates: 4 mirrored pairs again


def test_corp_gate_survives_float32_nan_and_the_mean_decay():
    """The gate finds its rows after a float32 round trip and refuses genomes that lack them; a failed (NaN)
    gate candidate keeps the centre; strategy.mean_decay shrinks the pending proposal with the centre, so a
    commit does not undo the decay (the mean stays bounded on a linear fitness)."""
    s = build(CoRP, population_size=8)
    first = s.ask()
    s.tell(first, first[:, 0])
    second = s.ask().astype(np.float32).astype(np.float64)
    better = second[:, 0].copy()
    better[0] = better[1] + 1.0
    failed = better.copy()
    failed[1] = np.nan  # the centre failed: no verdict, even though NaN ranks last
    s.tell(second, failed)
    assert np.array_equal(s.mean, np.zeros(6)) and s.commits == 0
    with pytest.raises(ValueError, match="the proposal that ask\\(\\) put first is not among the told genomes"):
        s.tell(s.ask()[::-1] + 1.0, better)
    decayed = build(CoRP, population_size=8)
    for _ in range(40):
        genomes = decayed.ask()
        fitness = genomes[:, 0].copy()
        if decayed.state_dict()["strategy"]["proposal"] is not None:
            fitness[0] = fitness[1] + 1.0  # every gate passes
        decayed.tell(genomes, fitness)
        decayed.shrink_mean(0.5)
    assert decayed.commits > 10 and abs(decayed.mean[0]) < 2.0


def test_guided_cma_injects_the_ridge_direction():
    """After a tell on a linear fitness, the next population holds a candidate along the fitted direction."""
    D, P = 20, 10
    s = build(GuidedCMAES, dim=D, population_size=P, sigma0=0.5, step_size="csa")
    up = np.zeros(D)
    up[3] = 1.0
    for _ in range(2):
        genomes = s.ask()
        s.tell(genomes, genomes @ up)
    direction = ridge_direction(s._x - s.mean, s._y, s.ridge)
    assert direction[3] > 0.6  # the regression finds the rising coordinate
    steps = s.ask() - s.mean
    cosines = steps @ direction / np.linalg.norm(steps, axis=1)
    assert cosines.max() > 0.999  # the injected candidate lies along it
    assert np.array_equal(s.ask(), s.ask())  # asked again before the tell: the same population


def test_guided_cma_step_size_option_reaches_pycma():
    import cma

    assert isinstance(build(GuidedCMAES, step_size="tpa").es.adapt_sigma, cma.sigma_adaptation.CMAAdaptSigmaTPA)
    assert isinstance(build(GuidedCMAES, step_size="csa").es.adapt_sigma, cma.sigma_adaptation.CMAAdaptSigmaCSA)


def test_nevergrad_recommendation_is_the_mean_and_resumes():
    s = build(NevergradStrategy, dim=8, optimizer="OnePlusOne")
    assert np.array_equal(s.mean, np.zeros(8))  # x0 before the first tell
    for _ in range(3):
        genomes = s.ask()
        s.tell(genomes, -np.sum((genomes - 0.5) ** 2, axis=1))
    assert np.linalg.norm(s.mean - 0.5) < np.linalg.norm(0.5 * np.ones(8))  # moved toward the optimum
    state = pickle.loads(pickle.dumps(s.state_dict()))
    again = build(NevergradStrategy, dim=8, optimizer="OnePlusOne")
    again.load_state_dict(state)
    assert np.array_equal(again.ask(), s.ask())
    assert "nevergrad" in PICKLE_MODULES


def test_random_search_keeps_the_best_advantage_and_never_recentres():
    s = build(RandomSearch)
    first = s.ask()
    s.tell(first, np.r_[1.0, np.zeros(7)])  # candidate 0: 1 above its generation's median
    assert np.array_equal(s.mean, first[0])
    second = s.ask()
    assert abs(second.mean()) < 0.3  # still around x0 = 0, not around the incumbent
    s.tell(second, np.r_[np.full(7, 0.9), 1.5])  # 0.6 above its median: not better
    assert np.array_equal(s.mean, first[0])
    s.tell(s.ask(), np.r_[np.zeros(7), 2.0])
    assert not np.array_equal(s.mean, first[0])


def test_scale_search_asks_on_the_scale_line_and_finds_the_best_scale():
    s = build(ScaleSearch, dim=5, population_size=16, span=1.0)
    for _ in range(8):
        genomes = s.ask()
        assert np.allclose(genomes, genomes[:, :1])  # x = (c - 1) ones
        t = genomes[:, 0]
        s.tell(genomes, -(t - 0.4) ** 2)  # the best scale c = 1.4
    assert abs(s.mean[0] - 0.4) < 0.02 and np.allclose(s.mean, s.mean[0])
    assert fit_scale(np.linspace(-1, 1, 9), -np.linspace(-1, 1, 9) ** 2) == pytest.approx(0.0, abs=1e-12)
    assert fit_scale(np.linspace(-1, 1, 9), np.linspace(-1, 1, 9)) == 1.0  # monotone: the best end


# --- configs, options, contract -----------------------------------------------------------------


@pytest.mark.parametrize("name", NEW)
def test_config_builds_and_conforms(name):
    """conf/strategy/<name>.yaml names the class, and the class with those options passes strategies.testing."""
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    assert cfg.name == name and cfg.genome.kind == "svd_lora" and cfg.genome.mode == "relative"
    options = OmegaConf.to_container(cfg.options)
    cls = get_strategy(cfg.name)
    assert cls is REGISTRY[name]
    strategy = cls(dim=240, x0=None, seed=0, population_size=cfg.population_size, sigma0=cfg.sigma0, **options)
    genomes = strategy.ask()
    strategy.tell(genomes, np.floor(8 * np.exp(-np.square(genomes).sum(axis=1) / 50)) / 8)  # k/8: ties
    assert np.all(np.isfinite(strategy.mean)) and len(pickle.dumps(strategy.state_dict())) < 5e6
    check_strategy(cls, options=options, verbose=False, memory_dim=2048)


@pytest.mark.parametrize("options", [{"optimizer": "NGOpt", "budget": 80}, {"optimizer": "NoisyOnePlusOne"},
                                     {"optimizer": "DiagonalCMA"}])
def test_nevergrad_optimizers_conform(options):
    check_strategy(NevergradStrategy, options=options, verbose=False, memory_dim=512)


@pytest.mark.parametrize("options", [{"gate": False}, {"lr": 2.0, "margin": 0.05}])
def test_corp_variants_conform(options):
    check_strategy(CoRP, options=options, verbose=False, memory_dim=512)


@pytest.mark.parametrize("options", [{"step_size": "tpa", "injections": 3}, {"injections": 0}])
def test_guided_cma_variants_conform(options):
    check_strategy(GuidedCMAES, options=options, verbose=False, memory_dim=512)


@pytest.mark.parametrize(
    "name, options, field",
    [
        ("randopt", {"top_k": 0}, "strategy.options.top_k"),
        ("randopt", {"top_k": 9}, "strategy.options.top_k"),              # more than P
        ("randopt", {"lr": 2.0}, "strategy.options.lr"),
        ("randopt", {"mirrored": "yes"}, "strategy.options.mirrored"),
        ("mezo_gv", {"group": 5}, "strategy.options.group"),              # more than P / 2
        ("mezo_gv", {"lr": -1}, "strategy.options.lr"),
        ("corp", {"lr": 0}, "strategy.options.lr"),
        ("corp", {"margin": -0.1}, "strategy.options.margin"),
        ("corp", {"gate": "no"}, "strategy.options.gate"),
        ("guided_cma", {"injections": 7}, "strategy.options.injections"),  # more than P - 2
        ("guided_cma", {"ridge": 0}, "strategy.options.ridge"),
        ("guided_cma", {"step_size": "fast"}, "strategy.options.step_size"),
        ("guided_cma", {"cma_options": {"AdaptSigma": True}}, "strategy.options.step_size"),
        ("nevergrad", {"optimizer": "Nope"}, "strategy.options.optimizer"),
        ("nevergrad", {"optimizer": "NGOpt"}, "strategy.options.budget"),  # NGOpt chooses by the budget
        ("nevergrad", {"budget": 3}, "strategy.options.budget"),           # below P
        ("scale_baseline", {"span": 0}, "strategy.options.span"),
        ("scale_baseline", {"shrink": 1.5}, "strategy.options.shrink"),
        ("random_baseline", {"top_k": 2}, "top_k"),                        # it has no options
    ],
)
def test_bad_options_are_one_line_naming_the_field(name, options, field):
    with pytest.raises(ValueError) as e:
        build(REGISTRY[name], **options)
    assert field in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_count_option_suggests_a_value_inside_its_range():
    """guided_cma at P 2 with its default injections=1: the message's example (was 1) must itself work."""
    import re

    with pytest.raises(ValueError, match=r"\[0, 0\] \(got 1\), e.g. strategy.options.injections=0$") as e:
        GuidedCMAES(6, None, 0, 2, 0.1)
    example = int(re.search(r"injections=(-?\d+)$", str(e.value)).group(1))
    assert GuidedCMAES(6, None, 0, 2, 0.1, injections=example).injections == 0


# --- the lab reports the oracle share and the cosine ------------------------------------------------


def test_lab_summary_reports_the_oracle_share_and_cosine():
    """Each seed's share is its held-out gain over the oracle's; the table prints share and cos."""
    from engine.lab.landscapes import MinibatchLandscape
    from engine.lab.output import format_table
    from engine.lab.runner import Setting, run_settings
    from engine.lab.summary import summarise

    land = MinibatchLandscape(240, seed=5, prompts=16)
    settings = [Setting(name, name, REGISTRY[name], 8, 0.3, {}, land, 2) for name in ("essa", "scale_baseline")]
    seeds = [0, 1]
    results, wall = run_settings(settings, seeds, progress=False)
    oracle = land.oracle()
    summary = summarise(settings, results, seeds, [oracle, oracle], wall)
    for s in summary["settings"]:
        shares = [e["oracle_share"] for e in s["per_seed"]]
        assert shares == pytest.approx([e["paired"]["diff"] / oracle["gain"] for e in s["per_seed"]])
        assert s["oracle_share"]["mean"] == pytest.approx(np.mean(shares))
        assert -1 <= s["cos_oracle"]["mean"] <= 1
    table = format_table(summary)
    assert "share" in table and "cos" in table
    assert f"{summary['settings'][1]['oracle_share']['mean']:+.2f}" in table.splitlines()[-1]
