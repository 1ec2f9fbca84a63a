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
