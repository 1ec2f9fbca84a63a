"""pass@k of two conditions on the same problems: per-problem values and paired bootstrap intervals.

The mean pass@k over problems (Chen et al. 2021, arXiv 2107.03374, Eq. 1; engine/results/passk.py)
is a mean over a finite problem set, and most of its uncertainty is which problems were drawn, not
which samples: a hard problem is hard for every condition. Two conditions scored on the SAME
problems are therefore compared by a paired bootstrap over problems (Efron & Tibshirani 1993, *An
Introduction to the Bootstrap*, ch. 6 (bootstrap standard errors and resampling the units) and
ch. 13 (percentile intervals)): resample the N problems with replacement, B times, with ONE set of
resampled indices for both conditions, and take the mean per-problem difference of each resample;
the 2.5 and 97.5 % percentiles of those B means are the 95 % interval. Problems the two conditions
find equally hard cancel in each resample, so the paired interval is narrower than one from two
independent resamples whenever per-problem pass@k is correlated across conditions (the test
tests/test_passk.py shows it). Why it matters here: F-GRPO (arXiv 2602.06717) compares training
methods by their pass@k curves up to k = 256, and a gap between two curves on a few hundred problems
can be problem-sampling noise; a gap is read as one only where its paired interval excludes 0.

Every k is compared on ONE problem set: the problems where both conditions have at least max(ks)
scorable samples (the fixed-set policy of :func:`engine.results.passk.pass_at_k_fixed_set`, applied
to the pair), and every k uses the same resampled indices, so the intervals of different k are
computed from the same resamples (the bootstrap is vectorised over k).

Shapes: K ks, N problems, B resamples.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from engine.results.passk import pass_at_k

RESAMPLES = 2000
CONFIDENCE = 0.95


def pass_at_k_per_problem(n, c, ks: Sequence[int]) -> np.ndarray:
    """pass@k of every problem for every k (Chen et al. 2021, Eq. 1, before the mean over problems).

    Args:
        n: scorable samples per problem, int (N,). c: correct samples per problem, int (N,).
        ks: K values of k, each <= min(n).

    Returns:
        float64 (K, N), row j = pass@ks[j] of each problem, values in [0, 1].

    Raises:
        ValueError: as :func:`engine.results.passk.pass_at_k` (k > n, c outside [0, n], k < 1).
    """
    n = np.atleast_1d(np.asarray(n, dtype=np.int64))
    c = np.atleast_1d(np.asarray(c, dtype=np.int64))
    if not len(ks):
        return np.zeros((0, n.size), dtype=np.float64)
    return np.stack([pass_at_k(n, c, int(k)) for k in ks])             # (K, N)


def bootstrap_weights(n_problems: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """How often each problem is drawn in each bootstrap resample (N draws with replacement).

    Args:
        n_problems: N >= 1. resamples: B >= 1. rng: the draws' generator.

    Returns:
        int64 (B, N); every row sums to N. Row b applied to any condition's (K, N) values gives that
        condition's resample b, so conditions weighted by the same rows are paired.

    Raises:
        ValueError: N < 1 or B < 1.
    """
    if n_problems < 1 or resamples < 1:
        raise ValueError(f"bootstrap: need n_problems >= 1 and resamples >= 1 (got {n_problems}, {resamples})")
    idx = rng.integers(0, n_problems, size=(resamples, n_problems))                 # (B, N)
    flat = idx + n_problems * np.arange(resamples)[:, None]                         # row-offset indices
    return np.bincount(flat.ravel(), minlength=resamples * n_problems).reshape(resamples, n_problems)


def _percentiles(means: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) percentile interval of (K, B) resampled means, each (K,)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence}: must lie in (0, 1), e.g. 0.95")
    lo, hi = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2], axis=1)
    return lo, hi


def bootstrap_mean_interval(values: np.ndarray, resamples: int = RESAMPLES, seed: int = 0,
                            confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over problems and its percentile bootstrap interval (Efron & Tibshirani 1993, ch. 13).

    Args:
        values: float (K, N) per-problem values (:func:`pass_at_k_per_problem`), N >= 1.
        resamples: B. seed: seed of ``numpy.random.default_rng``. confidence: two-sided coverage.

    Returns:
        (mean, low, high), each float64 (K,).

    Raises:
        ValueError: no problems, B < 1, or confidence outside (0, 1).
    """
    values = np.asarray(values, dtype=np.float64)
    w = bootstrap_weights(values.shape[1], resamples, np.random.default_rng(seed))  # (B, N)
    means = values @ w.T / values.shape[1]                                          # (K, B)
    lo, hi = _percentiles(means, confidence)
    return values.mean(axis=1), lo, hi


def paired_bootstrap_diff(treatment: np.ndarray, control: np.ndarray, resamples: int = RESAMPLES, seed: int = 0,
                          confidence: float = CONFIDENCE) -> dict:
    """Mean over problems of treatment - control with a paired percentile bootstrap interval.

    Both conditions are resampled with the SAME problem indices (module docstring; Efron &
    Tibshirani 1993, ch. 13), so what the problems share cancels.

    Args:
        treatment, control: float (K, N) per-problem pass@k on the same N problems, same order.
        resamples: B (default 2000). seed: seed of ``numpy.random.default_rng``.
        confidence: two-sided coverage (default 0.95).

    Returns:
        ``{"diff": (K,), "low": (K,), "high": (K,), "sd": (K,), "problems": N}``; the arrays are float64
        and None-free; ``sd`` is the standard deviation of the per-problem difference (ddof 1; what
        :func:`problems_for_half_width` plans a larger study from); NaN where N is too small (0, or 1 for sd).

    Raises:
        ValueError: the shapes differ, B < 1, or confidence outside (0, 1).
    """
    treatment, control = np.asarray(treatment, dtype=np.float64), np.asarray(control, dtype=np.float64)
    if treatment.shape != control.shape or treatment.ndim != 2:
        raise ValueError(f"paired bootstrap: treatment {treatment.shape} and control {control.shape} must both be "
                         f"(K, N) on the same problems")
    K, N = treatment.shape
    if N == 0:
        nan = np.full(K, np.nan)
        return {"diff": nan, "low": nan.copy(), "high": nan.copy(), "sd": nan.copy(), "problems": 0}
    per_problem = treatment - control                                                # (K, N)
    diff, lo, hi = bootstrap_mean_interval(per_problem, resamples, seed, confidence)
    sd = per_problem.std(axis=1, ddof=1) if N > 1 else np.full(K, np.nan)
    return {"diff": diff, "low": lo, "high": hi, "sd": sd, "problems": int(N)}


def problems_for_half_width(sd: float | None, half_width: float, confidence: float = CONFIDENCE) -> int | None:
    """Problems a study needs for its paired interval's half-width to be ``half_width`` (pass@k units, e.g.
    0.03 = 3 points), given the per-problem difference's standard deviation ``sd`` measured on a pilot:
    ``ceil((z sd / half_width)^2)`` with z the normal quantile of ``confidence`` (the textbook sample size
    of a mean; the bootstrap interval of the full study is close to it once N is in the tens). None when
    ``sd`` is not a usable estimate: None, NaN, infinite, or 0 (a pilot whose conditions never differed
    says nothing about how often they would).

    Raises:
        ValueError: ``half_width`` not a finite number > 0, ``sd`` < 0, or ``confidence`` outside (0, 1).
    """
    from math import ceil, isfinite
    from statistics import NormalDist

    if not (isfinite(half_width) and half_width > 0) or not 0 < confidence < 1:
        raise ValueError(f"problems_for_half_width: half_width {half_width} must be a finite number > 0 and "
                         f"confidence {confidence} in (0, 1)")
    if sd is not None and sd < 0:
        raise ValueError(f"problems_for_half_width: sd {sd} must be >= 0 (a standard deviation)")
    if sd is None or not isfinite(sd) or sd == 0:
        return None
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    return max(1, ceil((z * sd / half_width) ** 2))


def _json_number(v: float) -> float | None:
    return None if not np.isfinite(v) else float(v) + 0.0           # + 0.0: never -0.0


def diff_table(ks: Sequence[int], result: dict) -> dict[str, dict]:
    """A :func:`paired_bootstrap_diff` result as eval_summary.json stores it:
    ``{str(k): {"diff", "low", "high", "sd", "problems"}}`` (None for NaN)."""
    return {str(k): {"diff": _json_number(result["diff"][j]), "low": _json_number(result["low"][j]),
                     "high": _json_number(result["high"][j]), "sd": _json_number(result["sd"][j]),
                     "problems": result["problems"]}
            for j, k in enumerate(ks)}


def compare_pair(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], ks: Sequence[int],
                 resamples: int = RESAMPLES, seed: int = 0) -> dict[str, dict]:
    """pass@k of condition a minus condition b at every k, on their common problem set.

    Args:
        a, b: ``(n, c)`` per condition, int (N,) each: scorable and correct samples per problem, the
            same N problems in the same order for both.
        ks: the k values. resamples, seed: as :func:`paired_bootstrap_diff`.

    Returns:
        :func:`diff_table` of the paired bootstrap over the problems where both conditions have at
        least max(ks) scorable samples (``problems`` counts them).

    Raises:
        ValueError: the conditions have different numbers of problems.
    """
    (na, ca), (nb, cb) = (tuple(np.atleast_1d(np.asarray(x, dtype=np.int64)) for x in p) for p in (a, b))
    if na.shape != nb.shape:
        raise ValueError(f"pass@k comparison: {na.size} and {nb.size} problems; both conditions must be scored "
                         f"on the same problems")
    ks = sorted({int(k) for k in ks})
    both = (na >= ks[-1]) & (nb >= ks[-1]) if ks else np.zeros(na.shape, bool)      # (N,) the common set
    res = paired_bootstrap_diff(pass_at_k_per_problem(na[both], ca[both], ks),
                                pass_at_k_per_problem(nb[both], cb[both], ks), resamples, seed)
    return diff_table(ks, res)


def compare_conditions(counts: Mapping[str, tuple[np.ndarray, np.ndarray]], ks: Sequence[int], control: str,
                       resamples: int = RESAMPLES, seed: int = 0) -> tuple[dict[str, dict], list[dict]]:
    """Every condition against the control, and every pair of the other conditions.

    Args:
        counts: ``{condition: (n (N,), c (N,))}`` in the order the conditions were evaluated.
        ks: the k values. control: a key of ``counts``. resamples, seed: as :func:`paired_bootstrap_diff`
            (the same seed for every pair, so pairs on the same problem set share their resamples).

    Returns:
        ``(vs_control, pairs)``: ``vs_control = {condition: diff_table}`` for every condition but the
        control (condition minus control); ``pairs = [{"condition": a, "against": b, "pass_at_k":
        diff_table}]`` for every pair a before b of the non-control conditions (a minus b); empty with
        fewer than three conditions.

    Raises:
        ValueError: ``control`` is not a condition.
    """
    if control not in counts:
        raise ValueError(f"control={control!r} is not a condition; available: {', '.join(counts)}")
    others = [name for name in counts if name != control]
    vs_control = {name: compare_pair(counts[name], counts[control], ks, resamples, seed) for name in others}
    pairs = [{"condition": a, "against": b, "pass_at_k": compare_pair(counts[a], counts[b], ks, resamples, seed)}
             for i, a in enumerate(others) for b in others[i + 1:]]
    return vs_control, pairs
