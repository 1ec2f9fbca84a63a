"""Accuracy intervals, the paired test and the fitness signal diagnostics against known values."""
import math

import numpy as np
import pytest

from engine.evaluation.population import aggregate_fitness, question_z_fitness
from engine.results.stats import (format_summary, latest_per_problem, mcnemar_exact, newcombe_paired_interval,
                                  paired_comparison,
                          prompts_disagreeing, split_half_rank_correlation, summarise_conditions,
                          variance_ratio, wilson_interval)


@pytest.mark.parametrize("k, n, low, high", [
    (50, 100, 0.4038, 0.5962),   # textbook: Wilson 95% for 50/100
    (0, 10, 0.0, 0.2775),        # zero successes: the interval still has width (Wald would give [0, 0])
    (10, 10, 0.7225, 1.0),       # all successes, mirror image
    (81, 263, 0.2553, 0.3662),   # Newcombe (1998) example 81/263 -> 0.2553 to 0.3662
])
def test_wilson_interval_known_values(k, n, low, high):
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=5e-4) and hi == pytest.approx(high, abs=5e-4)


def test_wilson_rejects_impossible_counts():
    with pytest.raises(ValueError, match="outside"):
        wilson_interval(11, 10)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


@pytest.mark.parametrize("b, c, p", [
    (0, 0, 1.0),                     # no discordant pairs: no evidence
    (10, 0, 2 * 0.5 ** 10),          # all discordant one way: 2 / 1024
    (5, 5, 1.0),                     # balanced
    (12, 3, 0.03515625),             # sum_{i<=3} C(15, i) / 2^15 x 2 = 1152 / 32768
])
def test_mcnemar_exact_known_values(b, c, p):
    assert mcnemar_exact(b, c) == pytest.approx(p, rel=1e-9)


def test_paired_comparison_counts_discordant_problems():
    t = np.array([1, 1, 1, 0, 0, 1, np.nan, 1], dtype=float)   # NaN = unscorable = wrong
    k = np.array([0, 1, 0, 0, 1, 1, 1, 0], dtype=float)
    out = paired_comparison(t, k)
    assert (out["b"], out["c"], out["n"]) == (3, 2, 8)
    assert out["diff"] == pytest.approx((5 - 4) / 8)
    assert out["ci_low"] < out["diff"] < out["ci_high"]
    assert out["p_value"] == pytest.approx(mcnemar_exact(3, 2))
    with pytest.raises(ValueError, match="same problems"):
        paired_comparison(t, k[:-1])


def test_paired_interval_stays_inside_its_bounds_on_small_sets():
    """Issue 29e: 2 of 4 against 0 of 4 gave [-0.066, +1.066] with the normal approximation."""
    out = paired_comparison([1, 1, 0, 0], [0, 0, 0, 0])
    assert out["diff"] == 0.5 and -1.0 <= out["ci_low"] < 0.5 < out["ci_high"] <= 1.0
    assert (out["ci_low"], out["ci_high"]) == pytest.approx((-0.1021, 0.8500), abs=5e-4)  # hand-computed, psi = 0
    for t, k in [([1] * 5, [0] * 5), ([0] * 5, [1] * 5), ([1], [0]), ([1, 1], [1, 1]), ([0, 1, 1], [1, 0, 0])]:
        o = paired_comparison(t, k)
        assert -1.0 <= o["ci_low"] <= o["diff"] <= o["ci_high"] <= 1.0, (t, k, o)
        assert o["ci_high"] > o["ci_low"]   # never a zero-width interval (the normal one collapsed on all-equal diffs)


@pytest.mark.parametrize("a, b, c, d, low, high", [
    (59, 6, 16, 80, -0.1186, -0.0046),   # Cavo et al. 2012 (Fagerland et al. 2014; contingencytables ch. 8 tests)
    (1, 1, 7, 12, -0.5069, -0.0256),     # Bentur et al. 2009, the same book's other example
])
def test_newcombe_paired_interval_known_values(a, b, c, d, low, high):
    lo, hi = newcombe_paired_interval(a, b, c, d)
    assert lo == pytest.approx(low, abs=5e-4) and hi == pytest.approx(high, abs=5e-4)
    with pytest.raises(ValueError, match="must be >= 0"):
        newcombe_paired_interval(-1, b, c, d)
    assert all(math.isnan(x) for x in newcombe_paired_interval(0, 0, 0, 0))


def test_newcombe_paired_interval_covers_near_nominal_on_small_sets():
    """Simulated coverage at n = 12 with correlated pairs: the normal approximation undercovers here."""
    rng = np.random.default_rng(3)
    probs = np.array([0.45, 0.25, 0.05, 0.25])   # a, b, c, d: true difference b - c = 0.20
    hits = 0
    for _ in range(2000):
        a, b, c, d = rng.multinomial(12, probs)
        lo, hi = newcombe_paired_interval(a, b, c, d)
        hits += lo <= 0.20 <= hi
    assert 0.92 <= hits / 2000 <= 0.995


def test_paired_interval_is_narrower_than_independent_ones():
    rng = np.random.default_rng(0)
    k = (rng.random(500) < 0.6).astype(float)
    t = k.copy()
    t[np.flatnonzero(k == 0)[:30]] = 1.0   # 30 problems only the treatment solves
    t[np.flatnonzero(k == 1)[:5]] = 0.0    # 5 only the control solves
    out = paired_comparison(t, k)
    lo_t, hi_t = wilson_interval(int(t.sum()), 500)
    assert out["ci_high"] - out["ci_low"] < hi_t - lo_t
    assert out["p_value"] < 0.05 and out["diff"] > 0


def test_split_half_correlation_sees_real_differences_and_noise():
    rng = np.random.default_rng(1)
    skill = np.linspace(0.1, 0.9, 12)                       # 12 candidates that really differ
    real = (rng.random((12, 400)) < skill[:, None]).astype(float)
    assert split_half_rank_correlation(real) > 0.8
    noise = (rng.random((12, 400)) < 0.5).astype(float)     # identical candidates: ranking is noise
    assert abs(split_half_rank_correlation(noise)) < 0.6
    assert math.isnan(split_half_rank_correlation(np.ones((12, 10))))  # all tied


def test_variance_ratio_near_one_for_coin_flips_and_large_for_real_spread():
    rng = np.random.default_rng(2)
    noise = (rng.random((64, 200)) < 0.5).astype(float)
    assert 0.6 < variance_ratio(noise) < 1.5
    skill = np.linspace(0.2, 0.8, 64)
    real = (rng.random((64, 200)) < skill[:, None]).astype(float)
    assert variance_ratio(real) > 5


def test_prompts_disagreeing_counts_prompts_that_rank():
    r = np.array([[1, 0, 1, 0], [1, 0, 0, 0], [1, 0, 1, 1]], dtype=float)  # (P 3, N 4)
    assert prompts_disagreeing(r) == 2


def test_question_z_fitness_ignores_prompts_everyone_agrees_on():
    r = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=float)[:, :, None]  # (P, N, G)
    z = question_z_fitness(r)
    assert np.argsort(z).tolist() == np.argsort(aggregate_fitness(r)).tolist()
    assert z[0] > z[1] > z[2]
    # prompt 0 (everyone right) adds nothing: the fitness equals that on prompts 1-2 over 3 prompts
    assert question_z_fitness(r[:, 1:]) * 2 / 3 == pytest.approx(z)


def test_summary_from_validation_rows_uses_latest_step_and_pairs_with_sft():
    rows = []
    for step, cond, rewards in [(0, "sft", [1, 0, 0, 1]), (3, "mean", [0, 0, 0, 0]), (5, "mean", [1, 1, 0, 1]),
                                (5, "best", [1, 0, 0, 1])]:
        rows += [{"step": step, "condition": cond, "problem_id": f"p{i}", "reward": float(x)}
                 for i, x in enumerate(rewards)]
    per = latest_per_problem(rows)
    assert per["mean"].tolist() == [1, 1, 0, 1]
    s = summarise_conditions(per)
    assert s["accuracy"] == {"sft": 0.5, "mean": 0.75, "best": 0.5}
    assert s["paired"]["mean"]["b"] == 1 and s["paired"]["mean"]["c"] == 0
    assert "sft" not in s["paired"]
    text = format_summary(s, "demo", control_note="re-scored in the final engine call")
    assert "after ES (mean genome)" in text and "+0.250" in text
    mean_row = next(ln for ln in text.splitlines() if ln.startswith("after ES (mean genome)"))
    lo, hi = s["paired"]["mean"]["ci_low"], s["paired"]["mean"]["ci_high"]
    assert f"[{lo:+.3f}, {hi:+.3f}]" in mean_row and "1 / 0" in mean_row  # the paired interval and b / c
    assert "SFT warm start: re-scored in the final engine call" in text
    assert text.splitlines()[-1] == "b / c: problems only that row solves / only the SFT warm start solves"


def test_final_table_names_the_method_that_trained_the_policy():
    """An F-GRPO run's final table says F-GRPO, not GRPO, on its policy row; GRPO's says GRPO."""
    s = summarise_conditions({"sft": np.array([1.0, 0.0, 0.0]), "policy": np.array([1.0, 1.0, 0.0])})
    rows = {m: format_summary(s, "demo", method=m).splitlines() for m in ("grpo", "f-grpo")}
    assert any(ln.startswith("after GRPO (policy)") for ln in rows["grpo"])
    assert any(ln.startswith("after F-GRPO (policy)") for ln in rows["f-grpo"])
    assert not any("after GRPO (policy)" in ln for ln in rows["f-grpo"])


def test_final_table_columns_line_up_with_their_headers():
    s = summarise_conditions({"sft": np.array([1.0, 0.0, 0.0]), "policy": np.array([1.0, 1.0, 0.0])})
    lines = format_summary(s, "demo", method="f-grpo").splitlines()
    header = next(ln for ln in lines if ln.startswith("condition"))
    row = next(ln for ln in lines if ln.startswith("after F-GRPO"))
    assert header.index("paired diff") + len("paired diff") == row.index("+0.333") + len("+0.333")
    assert header.rindex("95% interval") == row.rindex("[")  # the paired interval starts under its header
