"""What a lab run reports: per setting, the final held-out gain over seeds with its 95 % interval, the
paired McNemar test per seed (what ``essa train`` reports, engine/results/stats.py), the difference to
the reference setting paired by seed, the signal diagnostics; a printed table and a progress figure.

Intervals across seeds are Student-t intervals of the mean (the seeds are independent runs); the
difference to the reference setting pairs runs of the same seed, which share the minibatch stream.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import asdict

import numpy as np

from engine.lab.runner import SeedResult, Setting
from engine.results.stats import paired_comparison


def t_interval(values, confidence: float = 0.95) -> dict:
    """Mean of ``values`` (n,) with its Student-t interval: ``{"mean", "ci_low", "ci_high", "n"}``
    (NaN interval when n < 2; NaN entries are dropped)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    n = int(v.size)
    mean = float(v.mean()) if n else float("nan")
    if n < 2:
        return {"mean": mean, "ci_low": float("nan"), "ci_high": float("nan"), "n": n}
    from scipy.stats import t

    half = float(t.ppf(0.5 + confidence / 2, n - 1) * v.std(ddof=1) / math.sqrt(n))
    return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "n": n}


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else float("nan")


def seed_summary(seed: int, res: SeedResult, oracle: dict | None) -> dict:
    """One seed's finals: held-out start/final and the paired test of final against start (None without a
    held-out set), its oracle share (held-out gain / the oracle's held-out gain; None without either or when
    the oracle gains nothing), true fitness start/final, sigma, |mean| and its cosine with the oracle's genome,
    the generations run and the candidate x problem evaluations they spent (``budget_evaluations`` may stop
    a seed early; adaptive prompts spend more per generation)."""
    last = res.rows[-1] if res.rows else {"true_fitness": res.true_start, "sigma": float("nan"), "evaluations": 0}
    out = {"seed": seed, "true_start": res.true_start, "true_final": last["true_fitness"], "sigma_final": last["sigma"],
           "mean_norm": float(np.linalg.norm(res.mean)), "cos_oracle": _cos(res.mean, oracle["x"]) if oracle else None,
           "generations_run": len(res.rows), "evaluations": int(last["evaluations"]),
           "held_out_start": None, "held_out_final": None, "paired": None, "oracle_share": None}
    if res.held_out_final is not None:
        out.update(held_out_start=float(res.held_out_start.mean()), held_out_final=float(res.held_out_final.mean()),
                   paired=paired_comparison(res.held_out_final, res.held_out_start))
        if oracle and oracle.get("gain"):
            out["oracle_share"] = out["paired"]["diff"] / oracle["gain"]
    return out


def signal_summary(results: list[SeedResult]) -> dict:
    """Signal diagnostics over every generation of every seed: medians, the rho means (of the 0/1 rewards, of
    the fitness the strategy is told, of the dense score), the fraction of generations whose centre scored
    at or above the population mean, and the mean N per generation."""
    rows = [r for res in results for r in res.rows]

    def col(k):
        return np.asarray([r[k] for r in rows], dtype=float)

    with warnings.catch_warnings():  # an all-NaN column (e.g. no generation ranked) gives NaN, quietly
        warnings.simplefilter("ignore", RuntimeWarning)
        return {"split_half_rho_mean": float(np.nanmean(col("split_half_rho"))) if rows else float("nan"),
                "variance_ratio_median": float(np.nanmedian(col("variance_ratio"))) if rows else float("nan"),
                "prompts_disagreeing_median": float(np.nanmedian(col("prompts_disagreeing"))) if rows else float("nan"),
                "max_minus_mean_median": float(np.median(col("fitness_max") - col("fitness_mean"))),
                "centre_at_or_above": float(np.mean(col("fitness_center") >= col("fitness_mean"))),
                "told_split_half_rho_mean": float(np.nanmean(col("told_split_half_rho"))) if rows else float("nan"),
                "dense_split_half_rho_mean": float(np.nanmean(col("dense_split_half_rho"))) if rows else float("nan"),
                "dense_mean": float(np.nanmean(col("dense_mean"))) if rows else float("nan"),
                "prompts_mean": float(np.mean(col("prompts"))) if rows else float("nan")}


def _won(paired: dict) -> bool:
    """A seed's gain counts when it is positive and the paired test says p < 0.05 (as essa train reads it)."""
    return paired["diff"] > 0 and paired["p_value"] < 0.05


def _score(entry: dict) -> float:
    """What a setting is ranked by: held-out gain where there is a held-out set, else the final true fitness."""
    p = entry["paired"]
    return p["diff"] if p is not None else entry["true_final"]


def setting_summary(s: Setting, results: list[SeedResult], seeds: list[int], oracle: dict | None,
                    reference: list[dict] | None) -> dict:
    """One setting's summary (module docstring); ``reference`` is setting 0's per-seed list (None for it)."""
    per_seed = [seed_summary(seed, res, oracle) for seed, res in zip(seeds, results)]
    has_held_out = per_seed[0]["paired"] is not None
    out = {"label": s.label, "strategy": s.strategy, "overrides": s.overrides, "population_size": s.population_size,
           "sigma0": s.sigma0, "options": s.options, "aggregate": s.aggregate, "landscape": s.landscape.name,
           "true_fitness_name": s.landscape.true_fitness_name,
           "dim": s.landscape.dim, "genome": s.genome, "prompts": s.landscape.prompts, "generations": s.generations,
           "rollout": asdict(s.rollout_or_default()), "mean_decay": s.mean_decay,
           "budget_evaluations": s.budget_evaluations,
           "evaluations": t_interval([e["evaluations"] for e in per_seed]),
           "mean_norm": t_interval([e["mean_norm"] for e in per_seed]),
           "cos_oracle": t_interval([e["cos_oracle"] for e in per_seed]) if oracle else None,
           "oracle_share": t_interval([e["oracle_share"] for e in per_seed]) if per_seed[0]["oracle_share"] is not None
           else None,
           "per_seed": per_seed, "true_final": t_interval([e["true_final"] for e in per_seed]),
           "gain": t_interval([e["paired"]["diff"] for e in per_seed]) if has_held_out else None,
           "wins": sum(_won(e["paired"]) for e in per_seed) if has_held_out else None,
           "signal": signal_summary(results) if s.landscape.binary else None, "vs_reference": None}
    if reference is not None and len(reference) == len(per_seed):
        out["vs_reference"] = {
            "score": t_interval([_score(a) - _score(b) for a, b in zip(per_seed, reference)]),
            "true_fitness": t_interval([a["true_final"] - b["true_final"] for a, b in zip(per_seed, reference)])}
    return out


def summarise(settings: list[Setting], results: list[list[SeedResult]], seeds: list[int],
              oracles: list[dict | None], wall_s: float) -> dict:
    """The whole run's summary (lab_summary.json): ``seeds``, ``wall_s``, ``settings`` (one
    :func:`setting_summary` each; setting 0 is the reference) and ``oracles`` (per setting: the
    landscape's oracle without its genome, or None)."""
    out, reference = [], None
    for s, res, orc in zip(settings, results, oracles):
        out.append(setting_summary(s, res, seeds, orc, reference))
        reference = reference or out[0]["per_seed"]
    return {"seeds": list(seeds), "wall_s": wall_s, "settings": out,
            "oracles": [None if o is None else {k: v for k, v in o.items() if k != "x"} for o in oracles]}


def sweep_value(summary: dict) -> float:
    """The value a Hydra sweeper optimises: setting 0's mean held-out gain, or its mean final true fitness."""
    s = summary["settings"][0]
    return (s["gain"] or s["true_final"])["mean"]
