"""pass@k estimator (engine/results/passk.py) against brute-force enumeration of k-subsets (Chen et al. 2021, Eq. 1)."""
from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from engine.results.passk import check_ks, default_ks, pass_at_k, pass_at_k_fixed_set, pass_at_k_table


def brute_force(n: int, c: int, k: int) -> float:
    """Fraction of the C(n, k) subsets of k samples that contain at least one correct sample."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 11))
def test_matches_brute_force_for_every_c_and_k(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_vectorised_over_problems_with_different_n():
    n = np.array([4, 8, 8, 10, 3])
    c = np.array([0, 1, 8, 3, 2])
    got = pass_at_k(n, c, 3)
    want = [brute_force(int(a), int(b), 3) for a, b in zip(n, c)]
    assert got.shape == (5,)
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_matches_exact_binomials_at_n_256():
    # pass@256 as reported by F-GRPO (arXiv 2602.06717): exact integers vs the stable product.
    n = 256
    for c in (0, 1, 2, 17, 128, 255, 256):
        for k in (1, 2, 16, 64, 200, 256):
            exact = 1 - math.comb(n - c, k) / math.comb(n, k)
            assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-10, abs=1e-15), (c, k)


def test_special_cases():
    assert pass_at_k(10, 0, 5) == 0.0            # nothing correct
    assert pass_at_k(10, 10, 1) == 1.0           # everything correct
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)   # pass@1 = c / n
    assert pass_at_k(10, 6, 5) == 1.0            # n - c < k: every subset holds a correct one
    tiny = pass_at_k(256, 1, 1)                  # small values keep relative precision
    assert tiny == pytest.approx(1 / 256, rel=1e-13)


def test_monotone_in_k():
    n, c = 64, np.arange(0, 65)
    prev = np.zeros(65)
    for k in range(1, 65):
        cur = pass_at_k(n, c, k)
        assert np.all(cur >= prev - 1e-15)
        prev = cur


def test_errors():
    with pytest.raises(ValueError, match="exceeds"):
        pass_at_k(4, 1, 5)                       # k > n
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)                       # c > n
    with pytest.raises(ValueError, match="positive integer"):
        pass_at_k(4, 1, 0)                       # k < 1
    with pytest.raises(ValueError, match="exceeds"):
        pass_at_k([8, 2], [1, 1], 4)             # one problem has too few samples


def test_table_and_ks():
    table = pass_at_k_table([4, 4], [0, 2], [1, 2, 4])
    assert table == pytest.approx({1: 0.25, 2: (0 + 5 / 6) / 2, 4: 0.5})
    assert default_ks(1) == [1]
    assert default_ks(8) == [1, 2, 4, 8]
    assert default_ks(12) == [1, 2, 4, 8, 12]
    assert default_ks(256)[-1] == 256
    assert check_ks([4, 1, 2, 2], 4) == [1, 2, 4]
    with pytest.raises(ValueError, match="ks="):
        check_ks([1, 8], 4)


def test_fixed_problem_set_keeps_pass_at_k_non_decreasing():
    # issue 16: problem A (n 4, c 0) and problem B (2 of 4 samples unscorable: n 2, c 2). Averaging each
    # k over "the problems with n >= k" gave 0.5, 0.5, 0.0 (B dropped out of k = 4 only).
    table, in_set = pass_at_k_fixed_set([4, 2], [0, 2], [1, 2, 4])
    assert list(in_set) == [True, False]                 # B has < max(ks) scorable samples: out for every k
    assert table == {1: 0.0, 2: 0.0, 4: 0.0}
    # random tables: every k over the same problems, so the curve never falls
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = rng.integers(0, 17, size=12)
        c = rng.integers(0, n + 1)
        ks = sorted(set(rng.integers(1, 17, size=4).tolist()))
        table, in_set = pass_at_k_fixed_set(n, c, ks)
        assert list(in_set) == [bool(x >= ks[-1]) for x in n]
        vals = [table[k] for k in ks]
        if in_set.any():
            assert all(b >= a - 1e-15 for a, b in zip(vals, vals[1:])), (n, c, ks, vals)
            assert vals == pytest.approx([np.mean([brute_force(int(a), int(b), k) for a, b in zip(n[in_set], c[in_set])])
                                          for k in ks])
        else:
            assert vals == [None] * len(ks)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k_fixed_set([4, 1], [0, 2], [1])        # c > n on a problem outside the set is still an error
    with pytest.raises(ValueError, match="positive integer"):
        pass_at_k_fixed_set([4], [1], [0, 2])


def test_zero_is_positive_zero():
    # -expm1(0.0) is -0.0: a problem nobody solves stored -0.0 and printed -0.000
    for n, k in ((4, 1), (4, 4), (256, 16)):
        v = pass_at_k(n, 0, k)
        assert v == 0.0 and np.copysign(1.0, v) == 1.0, (n, k)
    table = pass_at_k_table([4, 4], [0, 0], [1, 2])
    assert all(np.copysign(1.0, v) == 1.0 for v in table.values())
    assert "-0.0" not in json.dumps(table)


def test_train_sampled_pass_logs_what_it_scores_and_counts_pass_at_n(caplog):
    """The final call's sampled pass (essa train) says what it is scoring before its minutes of progress bars
    (a new user saw 3.5 silent minutes), and mean@n / pass@n follow the rewards it gets back."""
    import types

    import numpy as np

    from engine.commands.train import sampled_metrics

    rewards = np.array([[[1, 0, 0, 0], [0, 0, 0, 0]], [[1, 1, 1, 1], [1, 0, 0, 0]]], dtype=float)  # (A 2, N 2, n 4)
    evaluator = types.SimpleNamespace(score=lambda conds, problems, sampling: (rewards,))
    cfg = types.SimpleNamespace(seed=0, deadline_s=None, eval=types.SimpleNamespace(
        samples=4, sample_problems=2, max_tokens=16, sample_temperature=0.7, baselines=True))
    run = types.SimpleNamespace(cfg=cfg, evaluator=evaluator, task=types.SimpleNamespace(val=["p0", "p1", "p2"]),
                                condition_s=30.0, t_command=time.perf_counter(), run_dir=Path("run"), sft_dir=Path("sft"),
                                skipped=[])
    with caplog.at_level("INFO", logger="essa"):
        out = sampled_metrics(run, {"sft": None, "mean": None})
    assert "sampled pass: sft, mean on 2 held-out problems x 4 samples at temperature 0.7" in caplog.text
    assert out["sft"]["mean_at_n"] == 0.125 and out["sft"]["pass_at_n"] == 0.5
    assert out["mean"]["mean_at_n"] == 0.625 and out["mean"]["pass_at_n"] == 1.0
    # under deadline_s it runs only if it fits after the final call: 30 s per 3 completions -> 2 x 2 x 4 = 160 s
    cfg.deadline_s = 150.0
    with caplog.at_level("INFO", logger="essa"):
        assert sampled_metrics(run, {"sft": None, "mean": None}) is None
    assert "skipping the sampled pass (about 160 s" in caplog.text and run.skipped == ["sampled pass"]
    assert "essa eval adapters=[sft," in caplog.text and "include_base=false n=4 temperature=0.7 limit=2 max_tokens=16" in caplog.text
    cfg.deadline_s = 1000.0
    assert sampled_metrics(run, {"sft": None, "mean": None})["mean"]["pass_at_n"] == 1.0


# --- paired comparisons (engine/results/passk_compare.py) ----------------------------------------

from engine.results.passk_compare import (bootstrap_mean_interval, bootstrap_weights, compare_conditions,  # noqa: E402
                                          compare_pair, paired_bootstrap_diff, pass_at_k_per_problem,
                                          problems_for_half_width)


def _crn_counts(q: np.ndarray, n: int, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Uniforms (N, n) shared by every condition (common random numbers); c of a condition with per-sample
    success probability q (N,) = how many of a problem's uniforms fall below q."""
    u = rng.random((q.size, n))
    return u, np.full(q.size, n), (u < q[:, None]).sum(axis=1)


def test_per_problem_matrix_and_weights():
    n, c, ks = np.array([8, 8, 4]), np.array([0, 3, 4]), [1, 2, 4]
    m = pass_at_k_per_problem(n, c, ks)
    assert m.shape == (3, 3)
    np.testing.assert_allclose(m, [[brute_force(8, 0, k), brute_force(8, 3, k), brute_force(4, 4, k)] for k in ks])
    w = bootstrap_weights(5, 7, np.random.default_rng(0))
    assert w.shape == (7, 5) and w.dtype == np.int64 and np.all(w.sum(axis=1) == 5)
    assert not np.all(w == 1)                                      # resampled, not the identity
    mean, lo, hi = bootstrap_mean_interval(m, resamples=500, seed=1)
    np.testing.assert_allclose(mean, m.mean(axis=1))
    assert np.all(lo <= mean) and np.all(mean <= hi) and np.all(lo < hi)
    with pytest.raises(ValueError, match="n_problems >= 1"):
        bootstrap_weights(0, 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_mean_interval(m, confidence=95)


def test_identical_conditions_differ_by_exactly_zero():
    rng = np.random.default_rng(0)
    _, n, c = _crn_counts(rng.random(60), 16, rng)
    vals = pass_at_k_per_problem(n, c, [1, 4, 16])
    res = paired_bootstrap_diff(vals, vals.copy(), resamples=1000, seed=3)
    assert res["problems"] == 60
    assert np.all(res["diff"] == 0.0) and np.all(res["low"] == 0.0) and np.all(res["high"] == 0.0)


def test_the_per_problem_sd_sizes_a_study_whose_interval_has_the_asked_width():
    """The sd of the per-problem difference plans the problem count: a study of that many problems drawn like
    the pilot gets a bootstrap half-width close to the one asked for (issue 44: choose the problem count)."""
    rng = np.random.default_rng(5)
    pilot = rng.choice([-1.0, 0.0, 0.0, 0.0, 1.0, 1.0], size=(1, 60))        # k = n: per-problem 0 / 1 values
    res = paired_bootstrap_diff(pilot, np.zeros_like(pilot), resamples=500, seed=0)
    assert res["sd"][0] == pytest.approx(pilot.std(ddof=1))
    need = problems_for_half_width(res["sd"][0], 0.05)
    assert need == int(np.ceil((1.959964 * pilot.std(ddof=1) / 0.05) ** 2))
    big = rng.choice([-1.0, 0.0, 0.0, 0.0, 1.0, 1.0], size=(1, need))
    full = paired_bootstrap_diff(big, np.zeros_like(big), resamples=2000, seed=1)
    assert (full["high"][0] - full["low"][0]) / 2 == pytest.approx(0.05, rel=0.2)
    assert problems_for_half_width(res["sd"][0], 0.1) < need                # a wider interval needs fewer
    assert problems_for_half_width(None, 0.03) is None and problems_for_half_width(float("nan"), 0.03) is None
    assert np.isnan(paired_bootstrap_diff(pilot[:, :1], pilot[:, :1])["sd"][0])   # one problem: no sd
    assert problems_for_half_width(0.0, 0.03) is None and problems_for_half_width(float("inf"), 0.03) is None
    for sd, h in ((0.3, 0.0), (0.3, float("nan")), (0.3, float("inf"))):
        with pytest.raises(ValueError, match="half_width"):
            problems_for_half_width(sd, h)
    with pytest.raises(ValueError, match="sd -0.3 must be >= 0"):
        problems_for_half_width(-0.3, 0.03)


def test_a_condition_that_solves_more_has_a_positive_interval():
    rng = np.random.default_rng(1)
    q = rng.uniform(0.0, 0.6, size=80)
    _, n, c_ctrl = _crn_counts(q, 16, np.random.default_rng(2))
    _, _, c_trt = _crn_counts(np.minimum(q + 0.2, 1.0), 16, np.random.default_rng(2))   # same dice, higher skill
    assert np.all(c_trt >= c_ctrl) and np.any(c_trt > c_ctrl)
    table = compare_pair((n, c_trt), (n, c_ctrl), [1, 2, 4, 8, 16], resamples=1000, seed=0)
    for k, d in table.items():
        assert d["problems"] == 80
        assert 0.0 < d["low"] <= d["diff"] <= d["high"], (k, d)
    back = compare_pair((n, c_ctrl), (n, c_trt), [1, 16], resamples=1000, seed=0)   # the sign follows a - b
    assert back["1"]["diff"] == pytest.approx(-table["1"]["diff"]) and back["16"]["high"] < 0.0


def test_paired_interval_covers_the_truth():
    """Problems drawn from a population with known mean pass@k difference: the 95 % interval covers it
    in about 95 % of repeated studies (the per-problem estimator is unbiased, Chen et al. Eq. 1)."""
    ks, n, N, shift = [1, 4], 8, 120, 0.15
    grid = (np.arange(200_000) + 0.5) / 200_000                      # q ~ U(0, 0.7): the truth by quadrature
    q_all = 0.7 * grid
    truth = {k: float(np.mean((1 - (1 - np.minimum(q_all + shift, 1)) ** k) - (1 - (1 - q_all) ** k))) for k in ks}
    rng, covered, reps = np.random.default_rng(7), {k: 0 for k in ks}, 200
    for rep in range(reps):
        q = rng.uniform(0.0, 0.7, size=N)
        u = rng.random((N, n))
        c_ctrl, c_trt = (u < q[:, None]).sum(1), (u < np.minimum(q + shift, 1)[:, None]).sum(1)
        table = compare_pair((np.full(N, n), c_trt), (np.full(N, n), c_ctrl), ks, resamples=500, seed=rep)
        for k in ks:
            covered[k] += table[str(k)]["low"] <= truth[k] <= table[str(k)]["high"]
    for k in ks:
        assert 0.88 <= covered[k] / reps <= 0.995, (k, covered[k] / reps)


def test_pairing_narrows_the_interval():
    """Correlated conditions (hard problems are hard for both): the paired interval is much narrower than
    one from independent resamples of the two conditions."""
    rng = np.random.default_rng(4)
    q = rng.uniform(0.0, 0.25, size=150)                             # pass@16 from 0 to about 0.99
    _, n, c_ctrl = _crn_counts(q, 16, np.random.default_rng(5))
    _, _, c_trt = _crn_counts(q + 0.02, 16, np.random.default_rng(5))
    ks = [1, 4, 16]
    trt, ctrl = pass_at_k_per_problem(n, c_trt, ks), pass_at_k_per_problem(n, c_ctrl, ks)
    paired = paired_bootstrap_diff(trt, ctrl, resamples=2000, seed=0)
    g = np.random.default_rng(0)
    w_t, w_c = bootstrap_weights(150, 2000, g), bootstrap_weights(150, 2000, g)          # independent draws
    unpaired = (trt @ w_t.T - ctrl @ w_c.T) / 150                                      # (K, B)
    lo, hi = np.quantile(unpaired, [0.025, 0.975], axis=1)
    width_paired, width_unpaired = paired["high"] - paired["low"], hi - lo
    assert np.all(width_paired < 0.75 * width_unpaired), (width_paired, width_unpaired)
    assert width_paired[0] < 0.5 * width_unpaired[0]                   # pass@1: a quarter of the width here
    np.testing.assert_allclose(paired["diff"], (trt - ctrl).mean(axis=1))


def test_compare_conditions_common_set_pairs_and_errors():
    # problem 2 has only 2 scorable samples under "b": out of every comparison with b, in the others
    n = {"ctrl": np.array([4, 4, 4]), "a": np.array([4, 4, 4]), "b": np.array([4, 4, 2])}
    c = {"ctrl": np.array([0, 1, 2]), "a": np.array([1, 2, 2]), "b": np.array([0, 1, 2])}
    counts = {k: (n[k], c[k]) for k in n}
    vs, pairs = compare_conditions(counts, [1, 4], "ctrl", resamples=200, seed=0)
    assert list(vs) == ["a", "b"]
    assert vs["a"]["1"]["problems"] == 3 and vs["b"]["1"]["problems"] == 2 and vs["b"]["4"]["problems"] == 2
    assert vs["a"]["1"]["diff"] == pytest.approx((1 + 1 + 0) / 4 / 3)
    assert vs["b"]["1"]["diff"] == 0.0 and vs["b"]["4"] == {"diff": 0.0, "low": 0.0, "high": 0.0, "sd": 0.0, "problems": 2}
    assert [(p["condition"], p["against"]) for p in pairs] == [("a", "b")]
    assert pairs[0]["pass_at_k"]["1"]["diff"] == pytest.approx((1 + 1) / 4 / 2)
    assert compare_conditions({"x": counts["a"], "y": counts["b"]}, [1], "x", resamples=50)[1] == []
    again = compare_conditions(counts, [1, 4], "ctrl", resamples=200, seed=0)
    assert again == (vs, pairs)                                      # seeded: the same intervals
    with pytest.raises(ValueError, match="control='nope' is not a condition; available: ctrl, a, b"):
        compare_conditions(counts, [1], "nope")
    with pytest.raises(ValueError, match="same problems"):
        compare_pair((np.array([4, 4]), np.array([1, 1])), (np.array([4]), np.array([1])), [1])
    empty = compare_pair((np.array([2]), np.array([1])), (np.array([4]), np.array([1])), [4])
    assert empty == {"4": {"diff": None, "low": None, "high": None, "sd": None, "problems": 0}}
