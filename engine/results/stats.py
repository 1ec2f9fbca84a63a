"""Statistics for honest comparisons: accuracy intervals, paired tests, fitness signal-to-noise.

Accuracy of a condition on n held-out problems gets a Wilson score interval (Wilson 1927;
Brown, Cai & DasGupta 2001 recommend it over the Wald interval for binomial proportions). Two
conditions evaluated on the SAME problems are compared with a paired test: the exact McNemar test
(McNemar 1947), a two-sided binomial test on the discordant pairs, which is what a per-problem
0/1 comparison calls for, and Newcombe's (1998) paired interval for the difference. The fitness
diagnostics tell whether a generation's ranking carries signal (issue 11): split-half rank
correlation of candidate fitness and the population's fitness variance against the binomial
variance N prompts give by chance.

scipy.stats does the arithmetic (binomtest, spearmanr).
"""
from __future__ import annotations

import math

import numpy as np


def wilson_interval(correct: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion.

    Args:
        correct: successes (0 <= correct <= n).
        n: trials; n = 0 gives (nan, nan).
        confidence: two-sided coverage.

    Returns:
        (low, high) as fractions in [0, 1].

    Raises:
        ValueError: correct outside [0, n].
    """
    if n == 0:
        return float("nan"), float("nan")
    if not 0 <= correct <= n:
        raise ValueError(f"correct={correct} outside [0, n={n}]")
    from scipy.stats import binomtest

    ci = binomtest(int(correct), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts.

    Args:
        b: problems the first condition solves and the second does not.
        c: problems the second condition solves and the first does not.

    Returns:
        p-value in [0, 1]; 1.0 when there are no discordant pairs.
    """
    if b + c == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(int(b), int(b + c), 0.5, alternative="two-sided").pvalue)


def newcombe_paired_interval(a: int, b: int, c: int, d: int, confidence: float = 0.95) -> tuple[float, float]:
    """Newcombe's square-and-add interval (his method 10) for the difference of two paired proportions.

    Newcombe (1998), "Improved confidence intervals for the difference between binomial proportions
    based on paired data", Statistics in Medicine 17:2635-2650; as recommended and implemented by
    Fagerland, Lydersen & Laake (2014, Stat. Methods Med. Res. 23:1190; R package contingencytables,
    ``Newcombe_square_and_add_CI_paired_2x2``): the Wilson intervals (l1, u1), (l2, u2) of the two
    proportions combined with the estimated correlation psi of the pair. Unlike the normal
    approximation it never leaves [-1, 1] and does not collapse to a point when the differences are
    all equal; it keeps near-nominal coverage on small sets.

    Args:
        a: problems both conditions solve. b: only the first (treatment). c: only the second (control).
        d: neither. All >= 0.
        confidence: two-sided coverage.

    Returns:
        (low, high) for p1 - p2 = (b - c) / n, inside [-1, 1]; (nan, nan) when n = 0.

    Raises:
        ValueError: a negative count.
    """
    if min(a, b, c, d) < 0:
        raise ValueError(f"paired counts must be >= 0, got a={a} b={b} c={c} d={d}")
    n = a + b + c + d
    if n == 0:
        return float("nan"), float("nan")
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson_interval(a + b, n, confidence)
    l2, u2 = wilson_interval(a + c, n, confidence)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    if margins == 0 or 0 <= cross <= n / 2:
        psi = 0.0
    else:  # Newcombe's correlation estimate, with his continuity adjustment of a positive one
        psi = (cross - n / 2 if cross > n / 2 else cross) / math.sqrt(margins)
    diff = p1 - p2
    low = diff - math.sqrt(max((p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * psi * (p1 - l1) * (u2 - p2), 0.0))
    high = diff + math.sqrt(max((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * psi * (p2 - l2) * (u1 - p1), 0.0))
    return max(-1.0, low), min(1.0, high)  # inside by construction; guards the last rounding bit


def paired_comparison(treatment: np.ndarray, control: np.ndarray, confidence: float = 0.95) -> dict:
    """Paired comparison of two conditions scored on the same problems.

    Args:
        treatment: (n,) per-problem reward in {0, 1} (NaN = unscorable, counted as 0).
        control: (n,) the same problems under the control condition.
        confidence: two-sided coverage of the difference's interval.

    Returns:
        ``{"diff", "ci_low", "ci_high", "b", "c", "n", "p_value"}``: diff = mean(treatment) -
        mean(control); the interval is Newcombe's paired square-and-add interval
        (:func:`newcombe_paired_interval`: it uses the pairing, so it is narrower than two
        independent intervals, and stays inside [-1, 1] on small sets, where the normal
        approximation gave e.g. [-0.07, +1.07] for 2 of 4 against 0 of 4); b = problems only the
        treatment solves, c = only the control; p from :func:`mcnemar_exact`.

    Raises:
        ValueError: the arrays differ in length (they must be the same problems).
    """
    t = np.nan_to_num(np.asarray(treatment, dtype=float)) > 0.5
    k = np.nan_to_num(np.asarray(control, dtype=float)) > 0.5
    if t.shape != k.shape:
        raise ValueError(f"paired comparison needs the same problems: {t.shape} vs {k.shape}")
    n = int(t.size)
    a, b, c = int((t & k).sum()), int((t & ~k).sum()), int((~t & k).sum())
    diff = (b - c) / n if n else float("nan")
    low, high = newcombe_paired_interval(a, b, c, n - a - b - c, confidence)
    return {"diff": diff, "ci_low": low, "ci_high": high, "b": b, "c": c, "n": n, "p_value": mcnemar_exact(b, c)}


def split_half_rank_correlation(rewards: np.ndarray) -> float:
    """Spearman correlation of candidate fitness between two halves of the minibatch.

    A reliability measure of one generation's ranking: near 0 means the ranking is noise, near 1
    that another minibatch would rank the candidates the same way. The halves are the even and the
    odd prompt positions (the minibatch is already a random draw).

    Args:
        rewards: (P, N, G) or (P, N) rewards per candidate and prompt (NaN = unscorable).

    Returns:
        rho in [-1, 1]; NaN when P < 3, N < 2, or one half ranks every candidate equal.
    """
    r = np.asarray(rewards, dtype=float)
    r = r.reshape(r.shape[0], r.shape[1], -1)  # (P, N, G)
    if r.shape[0] < 3 or r.shape[1] < 2:
        return float("nan")
    halves = [np.nanmean(r[:, h::2, :].reshape(r.shape[0], -1), axis=1) for h in (0, 1)]  # 2 x (P,)
    if any(np.ptp(np.nan_to_num(x)) == 0 for x in halves):
        return float("nan")
    from scipy.stats import spearmanr

    ok = np.isfinite(halves[0]) & np.isfinite(halves[1])
    rho = spearmanr(halves[0][ok], halves[1][ok]).statistic
    return float(rho)


def variance_ratio(rewards: np.ndarray) -> float:
    """Population fitness variance over the variance N prompts give by chance.

    ratio = var_k(f_k) / (f_bar (1 - f_bar) / M), M = scorable completions per candidate: the spread
    against what candidates of equal skill with independent coin flips would show. It measures how
    far apart the candidates are, not whether their ranking is signal: under greedy decoding or
    common sampling seeds (``rollout.common_seeds``) candidates share their randomness, so small
    perturbations give ratios well below 1 and a ratio below 1 does not mean noise. The split-half
    rank correlation (:func:`split_half_rank_correlation`) is the signal measure.

    Args:
        rewards: (P, N, G) or (P, N) rewards in [0, 1] (NaN = unscorable).

    Returns:
        The ratio (float); NaN when P < 2 or f_bar is 0 or 1.
    """
    r = np.asarray(rewards, dtype=float).reshape(len(rewards), -1)  # (P, M)
    if r.shape[0] < 2:
        return float("nan")
    f = np.nanmean(r, axis=1)
    m = float(np.mean(np.isfinite(r).sum(axis=1)))
    fbar = float(np.nanmean(f))
    chance = fbar * (1 - fbar) / max(m, 1.0)
    return float(np.nanvar(f, ddof=1) / chance) if chance > 0 else float("nan")


def prompts_disagreeing(rewards: np.ndarray) -> int:
    """Prompts on which not every candidate got the same mean reward (the prompts that rank).

    Args:
        rewards: (P, N, G) or (P, N).

    Returns:
        Count in [0, N].
    """
    r = np.asarray(rewards, dtype=float)
    r = np.nan_to_num(r.reshape(r.shape[0], r.shape[1], -1).mean(axis=2), nan=-1.0)  # (P, N)
    return int((r.max(axis=0) != r.min(axis=0)).sum())


def pairwise_discordance(rewards: np.ndarray) -> float:
    """Mean share of prompts on which two candidates' verdicts differ, over all candidate pairs.

    For identical adapters (a placebo generation) this is the numerics floor: how often the batch slot
    alone flips a verdict. With k of P candidates right on a prompt, k (P - k) of the P (P - 1) / 2
    pairs disagree there.

    Args:
        rewards: (P, N, G) or (P, N) rewards; a (candidate, prompt) verdict is its mean over G, NaN
            (unscorable) counts as a verdict of its own.

    Returns:
        Share in [0, 1]; NaN when P < 2 or N == 0.
    """
    r = np.asarray(rewards, dtype=float)
    r = np.nan_to_num(r.reshape(r.shape[0], r.shape[1], -1).mean(axis=2), nan=-1.0)  # (P, N)
    P, N = r.shape
    if P < 2 or N == 0:
        return float("nan")
    differ = [sum(int(c) * (P - int(c)) for c in np.unique(col, return_counts=True)[1]) // 2 for col in r.T]
    return float(np.mean(differ) / (P * (P - 1) / 2))


def one_text_share(texts: list[list[str]]) -> float:
    """Share of prompts on which every candidate wrote the same completion text.

    Args:
        texts: [P][N] completion texts (one per candidate and prompt; the first sample when G > 1).

    Returns:
        Share in [0, 1]; NaN when there are no prompts.
    """
    if not texts or not texts[0]:
        return float("nan")
    return float(np.mean([len({t[n] for t in texts}) == 1 for n in range(len(texts[0]))]))


def numerics_share(placebo_var: float, population_var: float) -> float:
    """The part of a real population's fitness variance that identical adapters show too (issue 42):
    placebo fitness variance over the population's, capped at 1; NaN when the population has none."""
    if not population_var > 0:
        return float("nan")
    return float(min(placebo_var / population_var, 1.0))


VALIDATION_PROBLEMS = "validation_problems.parquet"  # per-problem validation rows of essa train / grpo
GRPO_METHODS = ("grpo", "f-grpo")
"""The run.json methods of essa grpo: GRPO (focal_gamma 0), F-GRPO (arXiv 2602.06717); their metrics.parquet
holds one row per optimiser ``step``, not per generation."""
CONDITION_ORDER = ("no_adapter", "sft", "mean", "best")
"""The order conditions are shown in (tables, figures, summaries); others follow, sorted."""
CONDITION_NAMES = {"no_adapter": "no adapter", "sft": "SFT warm start", "mean": "after ES (mean genome)",
                   "best": "after ES (best candidate)", "policy": "after GRPO (policy)"}


def ordered(per_condition: dict) -> dict:
    """``per_condition`` with its keys in :data:`CONDITION_ORDER`, then any other condition sorted."""
    keys = [c for c in CONDITION_ORDER if c in per_condition] + sorted(c for c in per_condition
                                                                       if c not in CONDITION_ORDER)
    return {c: per_condition[c] for c in keys}


def latest_per_problem(rows: list[dict]) -> dict[str, np.ndarray]:
    """Per-problem rewards of each condition at its latest validation step.

    Args:
        rows: validation_problems.parquet rows ``{"step", "condition", "problem_id", "reward"}``.

    Returns:
        ``{condition: (n,) float64}``, problems in the order they were written (the val split's),
        conditions in first-seen order.
    """
    last: dict[str, int] = {}
    for r in rows:
        last[r["condition"]] = max(last.get(r["condition"], -1), int(r["step"]))
    out: dict[str, list[float]] = {}
    for r in rows:
        if int(r["step"]) == last[r["condition"]]:
            out.setdefault(r["condition"], []).append(float(r["reward"]))
    return {k: np.asarray(v, dtype=float) for k, v in out.items()}


def summarise_conditions(per_problem: dict[str, np.ndarray], control: str = "sft",
                         confidence: float = 0.95) -> dict:
    """Accuracy, Wilson interval and the paired test against ``control`` for each condition.

    Args:
        per_problem: ``{condition: (n,) rewards}`` on the same n problems (see :func:`latest_per_problem`).
        control: the condition the others are compared with (the SFT warm start).

    Returns:
        ``{"n_problems", "accuracy": {c: acc}, "ci": {c: [low, high]}, "correct": {c: k},
        "paired": {c: paired_comparison(c, control)}}``; ``paired`` holds every condition other than
        the control and the base model, and is empty without the control.
    """
    acc, ci, correct, paired = {}, {}, {}, {}
    n = 0
    for cond, r in per_problem.items():
        ok = np.nan_to_num(np.asarray(r, dtype=float)) > 0.5
        n = int(ok.size)
        correct[cond] = int(ok.sum())
        acc[cond] = correct[cond] / n if n else float("nan")
        ci[cond] = list(wilson_interval(correct[cond], n, confidence))
    if control in per_problem:
        for cond, r in per_problem.items():
            if cond not in (control, "no_adapter") and len(r) == len(per_problem[control]):
                paired[cond] = paired_comparison(r, per_problem[control], confidence)
    return {"n_problems": n, "accuracy": acc, "ci": ci, "correct": correct, "paired": paired}


def condition_names(method: str | None = None) -> dict[str, str]:
    """Row names of the conditions (:data:`CONDITION_NAMES`); ``method`` (e.g. ``"f-grpo"``) names the
    trained ``policy`` row after the method that trained it."""
    names = dict(CONDITION_NAMES)
    if method:
        names["policy"] = f"after {method.upper()} (policy)"
    return names


def format_summary(summary: dict, task: str, control: str = "sft", control_note: str = "",
                   method: str | None = None) -> str:
    """The final table printed at the end of a run: accuracy, 95 % Wilson interval, correct/n, and the
    paired difference against ``control`` with its 95 % interval, b / c (problems only this condition
    solves / only the control solves) and exact McNemar p-value. ``control_note`` says where the
    control's row was measured (e.g. "re-scored in the final engine call"); printed after the header.
    ``method`` names the ``policy`` row (:func:`condition_names`)."""
    n = summary["n_problems"]
    names = condition_names(method)
    lines = [f"\nheld-out accuracy on {task} ({n} problems, greedy; 95% Wilson intervals; "
             f"paired vs {names.get(control, control)}: exact McNemar)"]
    if control_note:
        lines.append(f"{names.get(control, control)}: {control_note}")
    lines.append(f"{'condition':<28}{'accuracy':>9}  {'95% interval':<16}{'correct':>10}  {'paired diff':>11}  "
                 f"{'95% interval':<16}  {'b / c':^11} {'p':>7}")
    for cond, a in summary["accuracy"].items():
        lo, hi = summary["ci"][cond]
        pc = summary["paired"].get(cond)
        extra = (f"  {pc['diff']:>+11.3f}  [{pc['ci_low']:+.3f}, {pc['ci_high']:+.3f}]"
                 f"  {pc['b']:>4d} / {pc['c']:<4d} {pc['p_value']:>7.3g}") if pc else ""
        lines.append(f"{names.get(cond, cond):<28}{a:>9.3f}  [{lo:.3f}, {hi:.3f}]  "
                     f"{summary['correct'][cond]:>5d}/{n:<4d}{extra}")
    if summary["paired"]:
        lines.append(f"b / c: problems only that row solves / only the {names.get(control, control)} solves")
    return "\n".join(lines)
