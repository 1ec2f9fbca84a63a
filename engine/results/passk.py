"""pass@k: the probability that at least one of k tries solves a problem, estimated from n >= k samples.

Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (Codex paper, arXiv 2107.03374),
Eq. (1): with n samples of which c are correct, the unbiased estimator of pass@k is

    pass@k = E_problems[ 1 - C(n - c, k) / C(n, k) ].

The binomials overflow for the n = 256 samples the F-GRPO paper (arXiv 2602.06717) reports pass@256
with, so the ratio is computed as a product (Chen et al. 2021, Fig. 3, numerically stable form):

    C(n - c, k) / C(n, k) = prod_{i = n - c + 1}^{n} (1 - k / i)         (n - c >= k; else the ratio is 0)

summed in log space (``log1p``) and turned back with ``expm1``, so no term ever overflows and a
pass@k near 0 keeps its relative precision.

avg@n (mean accuracy over the n samples) is the k = 1 case: pass@1 = c / n.

One problem set for every k (:func:`pass_at_k_fixed_set`): pass@k of one problem never falls as k
grows, so the mean over problems does not either, as long as every k is averaged over the same
problems. The estimator needs n >= k; Chen et al.'s reference code (human-eval,
``evaluate_functional_correctness``) reports a k only when every problem has n >= k. Here a sample
the checker cannot score (status ``error``) is left out of n, never counted as wrong
(docs/ARCHITECTURE.md), so problems can have fewer than the n drawn samples: every k of a table is
averaged over the problems with at least max(ks) scorable samples, and the others are counted as
excluded (the same ones for every k). Zero is stored as 0.0, never -0.0.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np


def _check(n: np.ndarray, c: np.ndarray, k: int) -> None:
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"pass@k: k={k!r} must be a positive integer")
    if np.any(n < 0) or np.any(c < 0) or np.any(c > n):
        raise ValueError("pass@k: need 0 <= c <= n for every problem (c correct out of n samples)")
    if np.any(k > n):
        raise ValueError(f"pass@k: k={k} exceeds the number of samples n={int(n.min())}; "
                         f"draw n >= k samples per problem or drop k")


def pass_at_k(n, c, k: int) -> np.ndarray:
    """Unbiased pass@k per problem (Chen et al. 2021, Eq. 1), computed stably.

    Args:
        n: samples per problem, int scalar or array (N,).
        c: correct samples per problem, int scalar or array (N,), broadcastable with n.
        k: number of tries, 1 <= k <= n.

    Returns:
        float64 array of the broadcast shape of (n, c), values in [0, 1].

    Raises:
        ValueError: k < 1, k > n for some problem, or c outside [0, n].
    """
    n, c = np.broadcast_arrays(np.asarray(n, dtype=np.int64), np.asarray(c, dtype=np.int64))
    _check(n, c, k)
    shape = n.shape
    n, c = n.reshape(-1), c.reshape(-1)
    out = np.ones(n.shape, dtype=np.float64)         # n - c < k: every k-subset holds a correct sample
    todo = (n - c) >= k
    if todo.any():
        nn, cc = n[todo], c[todo]
        i = np.arange(1, int(nn.max()) + 1, dtype=np.float64)            # (I,)
        # log(1 - k/i) for i > k; the mask below only ever selects i > n - c >= k.
        log_terms = np.log1p(-k / np.maximum(i, k + 1))                    # (I,)
        in_range = (i[None, :] > (nn - cc)[:, None]) & (i[None, :] <= nn[:, None])   # (N', I)
        log_ratio = np.where(in_range, log_terms[None, :], 0.0).sum(axis=1)        # (N',)
        out[todo] = 0.0 - np.expm1(log_ratio)       # 0.0 - x, not -x: a zero stays +0.0 (never -0.0)
    return out.reshape(shape)


def pass_at_k_table(n, c, ks: Iterable[int]) -> dict[int, float]:
    """Mean pass@k over problems for every k in ``ks``.

    Args:
        n: samples per problem (N,). c: correct samples per problem (N,).
        ks: the k values; each must satisfy 1 <= k <= min(n).

    Returns:
        ``{k: mean over problems of pass@k}`` (NaN when there are no problems).

    Raises:
        ValueError: as :func:`pass_at_k`.
    """
    n = np.atleast_1d(np.asarray(n, dtype=np.int64))
    c = np.atleast_1d(np.asarray(c, dtype=np.int64))
    table = {}
    for k in ks:
        v = pass_at_k(n, c, int(k))
        table[int(k)] = float(v.mean()) if v.size else float("nan")
    return table


def pass_at_k_fixed_set(n, c, ks: Iterable[int]) -> tuple[dict[int, float | None], np.ndarray]:
    """Mean pass@k for every k in ``ks``, all over ONE problem set, so the values never fall as k grows.

    The set is the problems with at least max(ks) scorable samples (module docstring): a problem
    whose unscorable samples leave it n < max(ks) is excluded from every k, not only the larger ones.

    Args:
        n: scorable samples per problem, int (N,). c: correct samples per problem, int (N,), c <= n.
        ks: the k values (positive integers).

    Returns:
        ``({k: mean pass@k over the set, or None when the set is empty}, in_set (N,) bool)``.

    Raises:
        ValueError: a k < 1, or c outside [0, n].
    """
    n = np.atleast_1d(np.asarray(n, dtype=np.int64))
    c = np.atleast_1d(np.asarray(c, dtype=np.int64))
    ks = list(ks)
    for k in ks:
        _check(n[:0], c[:0], k)                                           # k a positive integer
    ks = sorted({int(k) for k in ks})
    if np.any(c < 0) or np.any(c > n):
        raise ValueError("pass@k: need 0 <= c <= n for every problem (c correct out of n samples)")
    in_set = n >= (ks[-1] if ks else 1)                                   # (N,)
    if not in_set.any():
        return {k: None for k in ks}, in_set
    return pass_at_k_table(n[in_set], c[in_set], ks), in_set


def default_ks(n: int) -> list[int]:
    """Powers of two up to n, plus n itself: ``default_ks(12) == [1, 2, 4, 8, 12]``.

    Raises:
        ValueError: n < 1.
    """
    if n < 1:
        raise ValueError(f"n={n}: need at least one sample per problem")
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks


def check_ks(ks: Sequence[int], n: int) -> list[int]:
    """Sorted, de-duplicated ks, each in [1, n].

    Raises:
        ValueError: a k outside [1, n], naming the fix.
    """
    bad = [k for k in ks if int(k) != k or not 1 <= k <= n]
    if bad:
        raise ValueError(f"ks={list(ks)}: every k must be an integer in [1, n={n}] (bad: {bad}); "
                         f"raise n or drop those k (ks=null gives powers of two up to n)")
    return sorted({int(k) for k in ks})
