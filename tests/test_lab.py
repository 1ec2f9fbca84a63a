"""The strategy lab (engine/lab/, ``essa lab``): the simulator's determinism and calibration, the classic
landscapes, the command end to end on tiny settings, one-line errors, a light ``--cfg job``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from engine.lab.landscapes import LANDSCAPES, MinibatchLandscape, MinibatchParams, make_landscape
from engine.lab.runner import COLUMNS, Setting, run_seed, run_settings

REPO = Path(__file__).resolve().parent.parent
SMALL = {"pool": 300, "held_out": 100, "features": 32}


def small_landscape(dim: int = 24, seed: int = 0, prompts: int = 16) -> MinibatchLandscape:
    return MinibatchLandscape(dim, seed, prompts, MinibatchParams.with_options(SMALL))


def essa_setting(landscape, generations: int = 3, population_size: int = 8, sigma0: float = 0.3, **kw) -> Setting:
    from strategies import REGISTRY

    return Setting("essa", "essa", REGISTRY["essa"], population_size, sigma0, {}, landscape, generations, **kw)


# --- the simulator -----------------------------------------------------------------------------------

def test_outcomes_are_deterministic_per_genome_and_problem():
    """The same landscape seed builds the same landscape; a genome's outcome on a problem does not depend on
    the other genomes or problems evaluated with it (greedy decoding's determinism)."""
    a, b = small_landscape(), small_landscape()
    X = np.random.default_rng(1).normal(0, 0.3, (5, a.dim))  # (P, D)
    probs = np.arange(40)
    s = a.scores(X, probs)  # (P, N)
    assert np.array_equal(s, b.scores(X, probs))
    assert np.array_equal(s[2], a.scores(X[2], probs)[0])  # alone or in a batch
    assert np.array_equal(s[:, 7:9], a.scores(X, probs[7:9]))  # whatever else is in the minibatch
    assert not np.array_equal(s, small_landscape(seed=1).scores(X, probs))  # another landscape seed: another task


def test_rewards_are_0_1_on_a_fresh_minibatch_seeded_by_seed_and_generation():
    land = small_landscape()
    X = np.zeros((3, land.dim))
    r = land.rewards(X, seed=0, generation=0)
    assert r.shape == (3, 16, 1) and set(np.unique(r)) <= {0.0, 1.0}
    assert np.array_equal(land.minibatch(0, 4), land.minibatch(0, 4))
    assert not np.array_equal(land.minibatch(0, 4), land.minibatch(0, 5))
    assert not np.array_equal(land.minibatch(0, 4), land.minibatch(1, 4))


def test_a_run_is_deterministic_per_seed():
    land = small_landscape()
    one, two = run_seed(essa_setting(land), 3), run_seed(essa_setting(land), 3)
    np.testing.assert_equal(one.rows, two.rows)  # NaN == NaN here
    assert np.array_equal(one.mean, two.mean)
    assert not np.array_equal(run_seed(essa_setting(land), 4).mean, one.mean)


def test_nearby_candidates_tie_more_often_than_far_ones():
    """Two genomes disagree on a problem only where its score changes sign between them: the closer they are
    (against the chaos field's correlation length), the fewer problems they disagree on."""
    land = MinibatchLandscape(240, 5, 64)
    rng = np.random.default_rng(0)
    probs = np.arange(2000)
    x = rng.normal(0, 0.3, 240)
    base = land.scores(x, probs)[0] > 0
    rates = []
    for scale in (0.01, 0.1, 0.3, 1.0):
        other = land.scores(x + rng.normal(0, scale, 240), probs)[0] > 0
        rates.append(float(np.mean(base != other)))
    assert rates == sorted(rates) and rates[0] < 0.02 < 0.1 < rates[-1], rates


def test_genome_zero_scores_what_the_calibration_says():
    """conf/lab.yaml's landscape (seed 5, the calibrated knobs): genome zero's held-out accuracy is 0.292
    (the real warm start measured 0.276-0.294), its expected accuracy 0.29 (MinibatchParams.accuracy0)."""
    land = MinibatchLandscape(240, 5, 64)
    zero = np.zeros(240)
    assert land.held_out(zero).shape == (500,)
    assert land.held_out(zero).mean() == pytest.approx(0.292, abs=1e-9)
    assert land.true_fitness(zero) == pytest.approx(0.29, abs=1e-6)


def test_the_oracle_holds_more_in_the_full_genome():
    """Calibrated to the gradient oracle of docs/results/genome-capacity.md: a few points inside D 240, about +17 in D 1920."""
    small, full = MinibatchLandscape(240, 5, 64).oracle(), MinibatchLandscape(1920, 5, 64).oracle()
    assert 0.02 < small["gain"] < 0.07 and 0.14 < full["gain"] < 0.21, (small["gain"], full["gain"])
    assert small["expected"] < full["expected"]


def test_unknown_knob_and_landscape_are_one_line_errors():
    with pytest.raises(ValueError, match=r"^landscape.options.chaoss: no such knob"):
        MinibatchParams.with_options({"chaoss": 1})
    with pytest.raises(ValueError, match=r"^landscape.name='nope' is not a landscape"):
        make_landscape("nope", 10)
    with pytest.raises(ValueError, match=r"^landscape.dim=0: must be an integer >= 1"):
        make_landscape("sphere", 0)


def test_landscape_names_match_the_schema():
    from engine.commands.lab_config import LANDSCAPE_NAMES

    assert sorted(LANDSCAPE_NAMES) == sorted(LANDSCAPES)


def test_dense_score_is_a_negative_deterministic_function_of_the_margin():
    """The dense score (issue 26): (P, N) nats, finite and <= 0, per (genome, problem) whatever else is
    evaluated with it; without its own field (dense_chaos 0) a monotone function of the score margin, above
    log(1/2) exactly where the problem is solved; its knobs leave the 0/1 outcomes untouched."""
    land = small_landscape()
    X = np.random.default_rng(2).normal(0, 0.5, (6, land.dim))  # (P, D)
    probs = np.arange(60)
    d = land.dense(X, probs)
    assert d.shape == (6, 60) and np.isfinite(d).all() and (d <= 0).all()
    assert np.array_equal(d[3], land.dense(X[3], probs)[0]) and np.array_equal(d[:, 5:7], land.dense(X, probs[5:7]))
    huge = land.dense(np.full((1, land.dim), 1e6), probs)  # far out: still finite, no NaN
    assert np.isfinite(huge).all() and (huge <= 0).all()
    pure = MinibatchLandscape(24, 0, 16, MinibatchParams.with_options({**SMALL, "dense_chaos": 0.0}))
    s, dp = pure.scores(X, probs), pure.dense(X, probs)
    assert np.array_equal(s, land.scores(X, probs))  # the dense knobs do not move the outcomes
    order = np.argsort(s.ravel())
    assert np.all(np.diff(dp.ravel()[order]) >= 0) and np.array_equal(dp > np.log(0.5), s > 0)
    shared = MinibatchLandscape(24, 0, 16, MinibatchParams.with_options({**SMALL, "dense_chaos": 0.0, "dense_eta": 0.0}))
    by_skill = np.argsort([shared.true_fitness(x) for x in X])  # without chaos the dense score ranks by skill
    assert all(np.array_equal(np.argsort(shared.dense(X, probs)[:, i], kind="stable"), by_skill) for i in range(60))
    rewards, dense = land.evaluate(X, seed=1, generation=2, prompts=20, dense=True)
    assert rewards.shape == dense.shape == (6, 20, 1)
    assert np.array_equal(rewards, land.rewards(X, seed=1, generation=2, prompts=20))
    assert np.array_equal(dense[:, :, 0], land.dense(X, land.minibatch(1, 2, 20)))


def lever_setting(land, generations: int = 4, **rollout):
    from engine.lab.runner import Rollout

    return essa_setting(land, generations, rollout=Rollout(prompts_per_generation=land.prompts, **rollout))


def test_dense_levers_go_through_the_products_shaping():
    """The lab tells the strategy essa train's shaped_fitness: weighted with weight 0 is exactly off, the
    tie-break and weighted runs are deterministic per seed and differ from off, the dense diagnostics are
    logged only with the dense score on."""
    from engine.evaluation.population import EvalResult, aggregate_fitness, dense_tiebreak
    from engine.lab.runner import Rollout, shape

    land = small_landscape()
    off = run_seed(lever_setting(land), 2)
    zero = run_seed(lever_setting(land, dense="weighted", dense_weight=0.0), 2)
    assert np.array_equal(off.mean, zero.mean) and np.isnan(off.rows[-1]["dense_mean"])
    assert zero.rows[-1]["dense_mean"] < 0 and np.isfinite(zero.rows[-1]["dense_split_half_rho"])
    for dense in ("tiebreak", "weighted"):
        one, two = run_seed(lever_setting(land, dense=dense), 2), run_seed(lever_setting(land, dense=dense), 2)
        np.testing.assert_equal(one.rows, two.rows)
        assert not np.array_equal(one.mean, off.mean)
    rewards, dense = land.evaluate(np.random.default_rng(0).normal(0, 0.3, (5, land.dim)), 0, 0, dense=True)
    told = shape(rewards, dense, 4, "mean", Rollout(prompts_per_generation=16, dense="tiebreak"))
    expected = dense_tiebreak(aggregate_fitness(rewards[:4]), dense[:4].mean(axis=(1, 2)))
    np.testing.assert_array_equal(told, expected)
    assert EvalResult  # the product's container is what shape() fills


def test_adaptive_prompts_follow_next_prompts_and_count_evaluations():
    """N per generation is engine.search.budget.next_prompts of the previous generation's split-half rho; the
    evaluations are the running sum of P N; the run is deterministic per seed."""
    from engine.search.budget import next_prompts

    land = small_landscape()
    s = lever_setting(land, generations=6, adaptive_prompts=True, noise_rho=0.5, max_prompts_per_generation=64)
    res = run_seed(s, 1)
    rows = res.rows
    assert rows[0]["prompts"] == 16 and len({r["prompts"] for r in rows}) > 1
    for a, b in zip(rows, rows[1:]):
        assert b["prompts"] == next_prompts(s.rollout, a["prompts"], a["split_half_rho"])
        assert b["evaluations"] == a["evaluations"] + 8 * b["prompts"]
    np.testing.assert_equal(rows, run_seed(s, 1).rows)


def test_budget_evaluations_stops_before_overspending():
    land = small_landscape()
    fixed = run_seed(essa_setting(land, generations=10, budget_evaluations=8 * 16 * 3 + 5), 0)
    assert len(fixed.rows) == 3 and fixed.rows[-1]["evaluations"] == 384
    grow = lever_setting(land, generations=10, adaptive_prompts=True, noise_rho=1.0, max_prompts_per_generation=64)
    grow.budget_evaluations = 8 * (16 + 32 + 64)
    rows = run_seed(grow, 0).rows  # rho < 1 always: 16, 32, 64, then 64 would overspend
    assert [r["prompts"] for r in rows] == [16, 32, 64] and rows[-1]["evaluations"] == grow.budget_evaluations


def test_lab_rollout_fields_are_essa_trains():
    """A lab setting moves 1:1 to essa train: the lab's rollout fields are essa train's, with its defaults."""
    from dataclasses import fields

    from engine.commands.lab_config import LabConfig
    from engine.commands.train_config import RolloutConfig
    from engine.lab.runner import Rollout

    train = {f.name: f.default for f in fields(RolloutConfig)}
    lab = {f.name: f for f in fields(LabConfig)}["rollout"].default_factory()
    for f in fields(lab):
        assert f.name in train and f.default == train[f.name], f.name
    for f in fields(Rollout):  # what the runner hands next_prompts and shaped_fitness
        assert f.name in train and f.default == train[f.name] or f.name == "prompts_per_generation", f.name


def test_real_signal_reads_a_runs_rollouts_as_the_lab_computes_it(tmp_path):
    """python -m engine.lab.calibrate --real-run: a run's rollouts/gen_*.parquet (candidate-major, prompt order,
    samples; the centre last) back into (A, N, G) arrays, and the lab's diagnostics of them."""
    from engine import io
    from engine.lab.calibrate import real_signal, real_signal_table, rollout_arrays
    from engine.lab.runner import Rollout, dense_signal
    from engine.results.stats import split_half_rank_correlation

    land = small_landscape()
    X = np.random.default_rng(5).normal(0, 3.0, (7, land.dim))  # 6 candidates + the centre, far apart
    rewards, dense = land.evaluate(X, 0, 0, dense=True)  # (7, 16, 1)
    ids = [f"p{k}" for k in (3, 1, 4, 15, 9, 2, 6, 5, 35, 8, 97, 93, 23, 84, 62, 64)]
    rows = [{"generation": 0, "candidate": a, "prompt_id": ids[n], "sample": 0, "reward": float(rewards[a, n, 0]),
             "dense": float(dense[a, n, 0]), "center": a == 6} for a in range(7) for n in range(16)]
    io.write_parquet(tmp_path / "rollouts" / "gen_000000.parquet", rows)
    r, d, P = rollout_arrays(tmp_path / "rollouts" / "gen_000000.parquet")
    assert P == 6 and np.array_equal(r, rewards) and np.array_equal(d, dense)
    out = real_signal(tmp_path, dense_weight=2.0)
    want = dense_signal(rewards, dense, 6, "mean", Rollout(dense="weighted", dense_weight=2.0))
    assert out[0]["prompts"] == 16 and out[0]["told_weighted"] == want["told_split_half_rho"]
    assert np.isfinite(out[0]["split_half_rho"]) and out[0]["split_half_rho"] == split_half_rank_correlation(rewards[:6])
    assert out[0]["dense_split_half_rho"] == want["dense_split_half_rho"] and out[0]["dense_mean"] < 0
    assert "| mean |" in real_signal_table(out)


# --- the likelihood landscape, with a fake engine (no vLLM in unit tests) ----------------------------------

class FakeEvaluator:
    """The parts of PopulationEvaluator the likelihood landscape uses; a candidate's log-probabilities are
    -|genome|^2 - 0.01 token, its answers correct where the first genome coordinate is below 0.5."""

    def __init__(self, dim: int):
        from types import SimpleNamespace

        self.codec = SimpleNamespace(dim=dim)
        self.tokenizer = lambda text, add_special_tokens=False: {"input_ids": [ord(c) % 97 for c in text]}
        self.genomes, self.calls, self.released = {}, [], []
        self.backend = SimpleNamespace(prompt_logprobs=self.prompt_logprobs, close=lambda: None)

    def prompts(self, problems):
        return [f"Q: {p.question} A:" for p in problems]

    def write_candidates(self, genomes, call):
        from engine.backends import AdapterRef, lora_int_id

        self.calls.append(call)
        refs = [AdapterRef(f"g{call}c{k}", lora_int_id(call, k), "/nowhere") for k in range(len(genomes))]
        self.genomes.update({r.name: g for r, g in zip(refs, genomes)})
        return refs

    def release(self, call):
        self.released.append(call)

    def prompt_logprobs(self, seqs, adapters, use_tqdm=False):
        return [[-float(self.genomes[a.name] @ self.genomes[a.name]) - 0.01 * t for t in range(len(s) - 1)]
                for s, a in zip(seqs, adapters)]

    def solution_likelihood(self, adapters, problems, timings=None):  # the real method, on this fake's parts
        from engine.evaluation.population import PopulationEvaluator
        return PopulationEvaluator.solution_likelihood(self, adapters, problems, timings)

    def score(self, refs, problems, sampling, use_tqdm=True):
        ok = [float(self.genomes[r.name][0] < 0.5) for r in refs]
        return np.asarray([[[v]] * len(problems) for v in ok]), None, None, None

    def close(self):
        pass


def test_likelihood_landscape_scores_solutions_per_candidate_and_problem():
    from engine.lab.likelihood import LikelihoodLandscape
    from engine.tasks import Problem

    train = [Problem(f"t{i}", f"{i} + 1", str(i + 1), f"{i} + 1 = {i + 1}. The final answer is \\boxed{{{i + 1}}}.")
             for i in range(20)] + [Problem("bare", "2 + 2", "4", None)]
    val = [Problem(f"v{i}", f"{i} + 2", str(i + 2), f"The final answer is \\boxed{{{i + 2}}}.") for i in range(6)]
    ev = FakeEvaluator(4)
    land = LikelihoodLandscape(ev, train, val, prompts=5, true_problems=3)
    assert land.dim == 4 and len(land.train) == 20  # the problem without a solution is not scored
    X = np.array([[0.0] * 4, [1.0, 0, 0, 0], [0, 2.0, 0, 0]])
    r = land.rewards(X, seed=0, generation=0)  # (P, N, 1): nats per token, the best genome first
    assert r.shape == (3, 5, 1) and np.all(r[0] > r[1]) and np.all(r[1] > r[2])
    assert np.array_equal(r, land.rewards(X, seed=0, generation=0))
    assert land.true_fitness(np.zeros(4)) > land.true_fitness(np.ones(4))
    assert list(land.held_out(np.zeros(4))) == [1.0] * 6 and list(land.held_out(np.ones(4))) == [0.0] * 6
    assert ev.calls == sorted(set(ev.calls)) and ev.released == ev.calls  # adapter ids never reused, files freed
    res = run_seed(essa_setting(land, generations=2, population_size=4), 0)
    assert np.isnan(res.rows[-1]["held_out"]) and res.held_out_final.shape == (6,)  # held out at start and end only


# --- classic landscapes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name, dim, population, sigma0, generations", [
    ("sphere", 5, 16, 0.3, 120),
    ("ellipsoid", 4, 16, 0.3, 200),
    ("rastrigin", 2, 64, 3.0, 100),  # multimodal: CMA-ES needs a large population (Hansen & Kern 2004)
])
def test_classic_landscapes_are_solved_by_essa(name, dim, population, sigma0, generations):
    land = make_landscape(name, dim, seed=0)
    results, _ = run_settings([essa_setting(land, generations, population, sigma0)], [0, 1, 2], progress=False)
    for res in results[0]:
        assert res.rows[-1]["true_fitness"] > -1e-6, (name, res.rows[-1]["true_fitness"])
        assert np.allclose(res.mean, land.oracle()["x"], atol=1e-3)
        assert np.isnan(res.rows[-1]["held_out"]) and np.isnan(res.rows[-1]["split_half_rho"])


# --- the command ---------------------------------------------------------------------------------------

TINY = ["landscape.dim=12", "landscape.prompts=8", "+landscape.options.pool=200", "+landscape.options.held_out=60",
        "+landscape.options.features=16", "generations=3", "n_seeds=2", "strategy.population_size=6", "progress=false"]


def run_lab(tmp_path: Path, *argv: str, tiny: list[str] = TINY) -> Path:
    from engine.cli import main

    out = tmp_path / "run"
    main(["lab", *tiny, *argv, f"hydra.run.dir={out}"])
    return out


def test_essa_lab_writes_the_documented_files(tmp_path, capsys):
    out = run_lab(tmp_path, "compare=[{label:wide},{label:narrow,strategy.sigma0:0.1},{strategy:openai_es}]")
    table = pq.read_table(out / "lab.parquet")
    assert table.column_names == list(COLUMNS)
    assert table.num_rows == 3 * 2 * 3  # settings x seeds x generations
    rows = table.to_pylist()
    assert [r["evaluations"] for r in rows[:3]] == [48, 96, 144]  # P N (g + 1)
    assert {r["label"] for r in rows} == {"wide", "narrow", "strategy=openai_es"}
    assert {r["strategy"] for r in rows} == {"essa", "openai_es"}
    summary = json.loads((out / "lab_summary.json").read_text())
    narrow = summary["settings"][1]
    assert narrow["sigma0"] == 0.1 and narrow["vs_reference"]["score"]["n"] == 2
    assert {"diff", "b", "c", "p_value"} <= set(narrow["per_seed"][0]["paired"])
    assert (out / "lab_progress.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "strategy lab: minibatch landscape" in printed and "narrow" in printed and "McNemar" in printed


def test_essa_lab_runs_the_fitness_levers(tmp_path):
    """rollout.* and budget_evaluations in compare entries, end to end: the summary records them, adaptive
    prompts spend more, the budget caps the spend."""
    out = run_lab(tmp_path, "compare=[{label:off},{label:tb,rollout.dense:tiebreak},"
                            "{label:w2,rollout.dense:weighted,rollout.dense_weight:2},"
                            "{label:ad,rollout.adaptive_prompts:true,rollout.noise_rho:1.0},"
                            "{label:ad budget,rollout.adaptive_prompts:true,rollout.noise_rho:1.0,budget_evaluations:150}]")
    summary = json.loads((out / "lab_summary.json").read_text())
    by = {s["label"]: s for s in summary["settings"]}
    assert by["tb"]["rollout"]["dense"] == "tiebreak" and by["w2"]["rollout"]["dense_weight"] == 2.0
    assert by["off"]["evaluations"]["mean"] == 6 * 8 * 3 and by["ad"]["evaluations"]["mean"] == 6 * (8 + 16 + 32)
    assert by["ad budget"]["evaluations"]["mean"] == 6 * (8 + 16) and by["ad budget"]["budget_evaluations"] == 150
    assert np.isfinite(by["tb"]["signal"]["dense_split_half_rho_mean"])
    rows = pq.read_table(out / "lab.parquet").to_pylist()
    assert [r["prompts"] for r in rows if r["label"] == "ad" and r["seed"] == 0] == [8, 16, 32]


def test_essa_lab_seeds_form_blocks_and_lists(tmp_path):
    from engine.commands.lab_config import run_seeds

    class C:
        seeds, seed, n_seeds = None, 1, 3
    assert run_seeds(C) == [3, 4, 5]
    C.seeds = [7, 9]
    assert run_seeds(C) == [7, 9]
    out = run_lab(tmp_path, "seeds=[4,6]", "landscape.name=sphere", tiny=[a for a in TINY if "options" not in a])
    assert sorted({r["seed"] for r in pq.read_table(out / "lab.parquet").to_pylist()}) == [4, 6]


@pytest.mark.parametrize("override, field", [
    ("strategy.name=nope", "strategy.name='nope' is not a known strategy"),
    ("landscape.name=nope", "landscape.name='nope' is not a landscape"),
    ("landscape.dim=0", "landscape.dim=0: must be >= 1"),
    ("strategy.sigma0=-0.1", "strategy.sigma0=-0.1: must be > 0"),
    ("generations=0", "generations=0: must be >= 1"),
    ("strategy.population_size=1", "strategy.population_size=1: must be >= 2"),
    ("compare=[{strategy.sigma00:0.1}]", "compare[0].strategy.sigma00=0.1:"),
    ("compare=[{seed:3}]", "compare[0].seed: belongs to the whole run"),
    ("compare=[{},{strategy:nope}]", "compare[1]: In 'lab': Could not find 'strategy/nope'; strategy options: cma_es"),
    ("compare=[{strategy:openai_es,strategy.population_size:5}]",
         "compare[0]: strategy.population_size=5: OpenAIES rejects it"),  # not a dump of strategy.options (issue 46)
    ("+landscape.options.chaoss=1", "landscape.options.chaoss: no such knob"),
    ("landscape.name=likelihood", "landscape.options.features: not an option of the likelihood landscape"),
    ("rollout.dense=dense", "rollout.dense='dense': use off, tiebreak"),
    ("rollout.noise_rho=2", "rollout.noise_rho=2.0: a rank correlation"),
    ("rollout.adaptive_prompts=true rollout.max_prompts_per_generation=4",
     "rollout.max_prompts_per_generation=4 < landscape.prompts=8"),
    ("budget_evaluations=10", "budget_evaluations=10: below one generation's P N = 48"),
])
def test_bad_input_is_one_line_naming_the_field(tmp_path, capsys, override, field):
    with pytest.raises(SystemExit) as exc:
        run_lab(tmp_path, *override.split(" "))
    assert exc.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("essa: error: ") and field in err[0], err


def test_levers_a_landscape_cannot_honour_are_one_line_errors():
    from types import SimpleNamespace

    from engine.commands.lab import lab_rollout

    def cfg(**r):
        return SimpleNamespace(landscape=SimpleNamespace(prompts=1), rollout=SimpleNamespace(
            **{"dense": "off", "dense_weight": 1.0, "adaptive_prompts": False, "noise_rho": 0.2,
               "max_prompts_per_generation": 256, **r}))
    sphere = make_landscape("sphere", 3)
    with pytest.raises(ValueError, match=r"^rollout.dense=tiebreak: the sphere landscape has no dense score"):
        lab_rollout(cfg(dense="tiebreak"), sphere)
    with pytest.raises(ValueError, match=r"^rollout.adaptive_prompts=true: the sphere landscape has no minibatch"):
        lab_rollout(cfg(adaptive_prompts=True), sphere)
    with pytest.raises(ValueError, match=r"^rollout.dense: the sphere landscape has no dense score"):
        sphere.evaluate(np.zeros((2, 3)), 0, 0, dense=True)
    assert lab_rollout(cfg(), sphere).prompts_per_generation == 1


def _essa(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.cli", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HYDRA_FULL_ERROR": "0"}, **kw)


def test_cfg_job_imports_no_torch():
    proc = _essa("lab", "--cfg", "job")
    assert proc.returncode == 0 and "landscape:" in proc.stdout, proc.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "engine.cli", "lab", "--cfg", "job"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    assert proc.returncode == 0 and "torch" not in imported and "vllm" not in imported


def test_multirun_runs_one_job_per_point(tmp_path):
    sweep = tmp_path / "sweep"
    proc = _essa("lab", "-m", "strategy=essa,openai_es", "seed=0,1", *TINY, "n_seeds=1", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    seeds = {}
    for job in sorted(sweep.glob("[0-9]*")):
        rows = pq.read_table(job / "lab.parquet").to_pylist()
        seeds[(rows[0]["strategy"], rows[0]["seed"])] = len(rows)
    assert seeds == {("essa", 0): 3, ("essa", 1): 3, ("openai_es", 0): 3, ("openai_es", 1): 3}
