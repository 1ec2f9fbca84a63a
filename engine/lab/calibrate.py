"""Calibration of the ``minibatch`` simulator: its statistics beside the real runs' (docs/results/evolution.md).

    python -m engine.lab.calibrate                 # D 240 over 16 seeds, D 1920 over 4; a Markdown table
    python -m engine.lab.calibrate --seeds 32 --landscape-seed 3 --options '{"chaos": 0.5}'
    python -m engine.lab.calibrate --real-run outputs/arithmetic/essa/<time>   # a real run's signal diagnostics

The setting is the real default run's: CMA-ES (``strategy=essa``: full covariance, tie-averaged
weights), P 16, N 64, sigma0 0.3, 10 generations, 500 held-out problems, and the same with the genome
widened to D 1920 (alpha 1). The real column quotes the study of 2026-12-01
(docs/log/2026-12-01-does-evolution-improve.md: the three default seeds, the probes, the full-genome runs
and the gradient oracle). How the
knobs were set (engine/lab/landscapes.py, MinibatchParams), one target each, in this order: chaos and
length from the discordant pairs between genome zero and the final mean (b + c, about 14 % of the
held-out set) and the candidates' spread (max - mean, variance ratio); sharp and sharpness from the
centre scoring at or above its population in 8-9 of 10 generations with a split-half rho near 0.1-0.2
(several mild sharp directions give the same gap with less rank signal than one steep one); gain_top
and reach_top from the ES gain (+3 to +5 points in 10 generations, then a plateau); gain_low from the
oracle's +17 points at D 1920; landscape seed 5 from genome zero's held-out accuracy (0.292 measured;
seeds 0-7 give 0.266-0.326, a 500-problem set's standard error is 0.02).

The table this prints with the calibrated knobs (2026-12-02; lab: 16 seeds at D 240, 4 at D 1920)::

    statistic                                 real, D 240        lab, D 240          real, D 1920   lab, D 1920
    held-out accuracy of genome zero          0.276-0.294        0.292 (exp. 0.290)  0.276 / 0.284  0.292
    population fitness mean over generations  0.19-0.38          0.21-0.35           -              0.21-0.36
    candidate max - population mean           0.05-0.10          0.04-0.09           -              0.05-0.11
    split-half rank correlation, mean (range) ~0.1 (-0.3..0.5)   0.18 (-0.31..0.60)  0.26 / 0.14    0.16 (-0.17..0.50)
    variance ratio                            0.2-0.6            0.22-0.80           -              0.37-0.99
    centre >= population mean, of 10          8-9                8.6 (6-10)          9              6.8 (5-9)
    final held-out gain, points               +3.0 +5.4 +3.2     +3.6 +- 1.9         +3.4 +4.0      +3.5 +- 1.0
    discordant problems b + c                 73 61 72           65                  87 66          88
    sigma after 10 generations                shrinks            0.261               0.37 / 0.365   0.333
    norm of the mean genome                   6.0 5.9 6.2        6.2                 24.1 / 21.3    19.8
    cosine of the mean with the oracle        -0.05..-0.01       +0.17               -0.03 / -0.00  +0.00
    oracle's held-out gain, points            +3.2 (loss oracle) +4.0 (exp. +5.0)    +17.4          +17.4 (+17.0)

Where it does not match: the cosine at D 240 (the real oracle optimised the supervised loss, whose
direction is not the one ES climbs; the lab's oracle and ES climb the same expected accuracy), the
centre at D 1920 (6.8 against 9 of 10: the lower blocks add chaos but no sharpness), the variance
ratio's upper end (0.8 against 0.6).
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from engine.lab.landscapes import MinibatchLandscape, MinibatchParams
from engine.lab.runner import Setting, run_settings
from engine.lab.summary import seed_summary

REAL = {  # statistic -> (real at D 240, real at D 1920), from docs/log/2026-12-01-does-evolution-improve.md
    "held_out_zero": ("0.276-0.294 (SFT rows of 9 runs)", "0.276 / 0.284"),
    "fitness_range": ("0.19-0.38 (probe C)", "-"),
    "max_minus_mean": ("0.05-0.10 (probe C)", "-"),
    "prompts_disagreeing": ("not logged at the default", "-"),
    "split_half_rho": ("mean ~0.1, -0.3 to +0.5", "mean 0.26 / 0.14, -0.43 to +0.85"),
    "variance_ratio": ("0.2-0.6", "-"),
    "centre_at_or_above": ("8-9 of 10", "9 of 10 (seed 1)"),
    "gain": ("+3.0, +5.4, +3.2 (mean +3.9)", "+3.4, +4.0"),
    "significant": ("1 of 3 (p 0.10, 0.0007, 0.08)", "1 of 2 (p 0.086, 0.019)"),
    "discordant": ("73, 61, 72", "87, 66"),
    "sigma_final": ("shrinks from 0.30", "0.37 / 0.365"),
    "mean_norm": ("6.0, 5.9, 6.2", "24.1 / 21.3"),
    "cos_oracle": ("-0.007, -0.053, -0.010", "-0.003 / -0.028"),
    "oracle_gain": ("+3.2 (supervised loss, not accuracy)", "+17.4"),
}
NAMES = {
    "held_out_zero": "held-out accuracy of genome zero (500 problems)",
    "fitness_range": "population fitness mean across generations (median per-seed min - max)",
    "max_minus_mean": "candidate max - population mean (10-90 % of generations)",
    "prompts_disagreeing": "problems on which the 16 candidates disagree (10-90 %)",
    "split_half_rho": "split-half rank correlation: mean (5-95 %)",
    "variance_ratio": "variance ratio (10-90 %)",
    "centre_at_or_above": "centre at or above the population mean (of 10 generations, mean over seeds)",
    "gain": "final held-out gain of the mean genome, points: mean +- sd (min, max)",
    "significant": "seeds with a paired gain at p < 0.05",
    "discordant": "discordant problems b + c, final mean vs genome zero (mean)",
    "sigma_final": "sigma after 10 generations (mean)",
    "mean_norm": "norm of the mean genome after 10 generations (mean)",
    "cos_oracle": "cosine of the final mean with the oracle's genome (mean)",
    "oracle_gain": "oracle's held-out gain, points (expected gain)",
}


def simulate(dim: int, seeds: list[int], landscape_seed: int = 5, options: dict | None = None,
             generations: int = 10) -> dict:
    """The default ESSA setting (P 16, N 64, sigma0 0.3, CMA-ES) on the simulator at ``dim``.

    Returns:
        ``{"rows": lab rows, "seeds": per-seed summaries (engine.lab.summary.seed_summary), "oracle": dict,
        "held_out_zero": held-out accuracy of genome zero, "expected_zero": its expected accuracy}``.
    """
    from strategies import REGISTRY

    land = MinibatchLandscape(dim, landscape_seed, 64, MinibatchParams.with_options(options))
    s = Setting("essa", "essa", REGISTRY["essa"], 16, 0.3, {"diagonal": "auto"}, land, generations)
    results, _ = run_settings([s], seeds, progress=False)
    oracle = land.oracle()
    per_seed = [seed_summary(seed, res, oracle) for seed, res in zip(seeds, results[0])]
    return {"rows": [r for res in results[0] for r in res.rows], "seeds": per_seed, "oracle": oracle,
            "held_out_zero": per_seed[0]["held_out_start"], "expected_zero": land.true_fitness(np.zeros(dim))}


def _significant(paired: dict) -> bool:
    return paired["diff"] > 0 and paired["p_value"] < 0.05


def _pct(v: np.ndarray, lo: float, hi: float, fmt: str = ".2f") -> str:
    a, b = np.nanpercentile(v, [lo, hi])
    return f"{a:{fmt}} to {b:{fmt}}"


def statistics(sim: dict) -> dict[str, str]:
    """The calibration statistics (:data:`NAMES`) of one :func:`simulate` result, formatted."""
    rows, per_seed = sim["rows"], sim["seeds"]
    col = lambda k: np.asarray([r[k] for r in rows], dtype=float)  # noqa: E731
    by_seed = {}
    for r in rows:
        by_seed.setdefault(r["seed"], []).append(r)
    lows = [min(r["fitness_mean"] for r in rs) for rs in by_seed.values()]
    highs = [max(r["fitness_mean"] for r in rs) for rs in by_seed.values()]
    gains = np.asarray([e["paired"]["diff"] for e in per_seed]) * 100
    centre = [sum(r["fitness_center"] >= r["fitness_mean"] for r in rs) * 10 / len(rs) for rs in by_seed.values()]
    o = sim["oracle"]
    return {
        "held_out_zero": f"{sim['held_out_zero']:.3f} (expected {sim['expected_zero']:.3f})",
        "fitness_range": f"{np.median(lows):.2f} - {np.median(highs):.2f}",
        "max_minus_mean": _pct(col("fitness_max") - col("fitness_mean"), 10, 90),
        "prompts_disagreeing": _pct(col("prompts_disagreeing"), 10, 90, ".0f"),
        "split_half_rho": f"{np.nanmean(col('split_half_rho')):.2f} ({_pct(col('split_half_rho'), 5, 95)})",
        "variance_ratio": _pct(col("variance_ratio"), 10, 90),
        "centre_at_or_above": f"{np.mean(centre):.1f} ({min(centre):.0f}-{max(centre):.0f})",
        "gain": f"{gains.mean():+.1f} +- {gains.std(ddof=1):.1f} ({gains.min():+.1f}, {gains.max():+.1f})",
        "significant": f"{sum(_significant(e['paired']) for e in per_seed)} of {len(per_seed)}",
        "discordant": f"{np.mean([e['paired']['b'] + e['paired']['c'] for e in per_seed]):.0f}",
        "sigma_final": f"{np.mean([e['sigma_final'] for e in per_seed]):.3f}",
        "mean_norm": f"{np.mean([e['mean_norm'] for e in per_seed]):.1f}",
        "cos_oracle": f"{np.mean([e['cos_oracle'] for e in per_seed]):+.3f}",
        "oracle_gain": f"{o['gain'] * 100:+.1f} ({(o['expected'] - sim['expected_zero']) * 100:+.1f})",
    }


def table(low: dict[str, str], high: dict[str, str], n_low: int, n_high: int) -> str:
    """The Markdown calibration table: real and simulated, at D 240 and D 1920."""
    lines = [f"| statistic | real, D 240 | lab, D 240 ({n_low} seeds) | real, D 1920 | lab, D 1920 ({n_high} seeds) |",
             "|---|---|---|---|---|"]
    for key, name in NAMES.items():
        lines.append(f"| {name} | {REAL[key][0]} | {low[key]} | {REAL[key][1]} | {high[key]} |")
    return "\n".join(lines)


def rollout_arrays(path) -> tuple[np.ndarray, np.ndarray | None, int]:
    """One generation's rollouts/gen_*.parquet of ``essa train`` (engine/evaluation/population.py writes it
    candidate-major, then the minibatch's prompt order, then samples) as arrays.

    Returns:
        ``(rewards (A, N, G), dense (A, N, G) nats or None without a dense column, P)``: A candidates in
        candidate order, the centre (``center`` true) last when logged, P the candidates told to the strategy.
    """
    from engine import io

    rows = io.read_rows(path)
    cands = sorted({r["candidate"] for r in rows})
    prompts = list(dict.fromkeys(r["prompt_id"] for r in rows if r["candidate"] == cands[0]))
    G = 1 + max(r["sample"] for r in rows)
    ci, pi = {c: i for i, c in enumerate(cands)}, {p: i for i, p in enumerate(prompts)}
    has_dense = "dense" in rows[0]
    rewards = np.full((len(cands), len(prompts), G), np.nan)
    dense = np.full_like(rewards, np.nan) if has_dense else None
    for r in rows:
        at = (ci[r["candidate"]], pi[r["prompt_id"]], r["sample"])
        rewards[at] = np.nan if r["reward"] is None else r["reward"]
        if has_dense:
            dense[at] = np.nan if r["dense"] is None else r["dense"]
    P = len(cands) - int(any(r.get("center") for r in rows))
    return rewards, dense, P


def real_signal(run_dir, dense_weight: float = 2.0) -> list[dict]:
    """The lab's signal diagnostics of a real ``essa train`` run, from its rollouts (one dict per generation):
    ``generation, prompts, split_half_rho`` (0/1), ``dense_split_half_rho``, ``dense_mean`` (nats) and the
    split-half rho of the fitness ``rollout.dense=tiebreak`` and ``weighted`` (``dense_weight``) would tell
    (``told_tiebreak``, ``told_weighted``), computed as the lab computes them (engine.lab.runner.dense_signal),
    to set the simulator's ``dense_chaos`` against a run with ``rollout.dense`` on (landscapes.py)."""
    from pathlib import Path

    from engine.lab.runner import Rollout, dense_signal
    from engine.results.stats import split_half_rank_correlation

    out = []
    for path in sorted(Path(run_dir, "rollouts").glob("gen_*.parquet")):
        rewards, dense, P = rollout_arrays(path)
        row = {"generation": int(path.stem.split("_")[1]), "prompts": rewards.shape[1],
               "split_half_rho": split_half_rank_correlation(rewards[:P])}
        if dense is not None:
            for name, roll in (("tiebreak", Rollout(dense="tiebreak")),
                               ("weighted", Rollout(dense="weighted", dense_weight=dense_weight))):
                sig = dense_signal(rewards, dense, P, "mean", roll)
                row[f"told_{name}"] = sig["told_split_half_rho"]
            row.update(dense_split_half_rho=sig["dense_split_half_rho"], dense_mean=sig["dense_mean"])
        out.append(row)
    return out


def real_signal_table(rows: list[dict]) -> str:
    """:func:`real_signal`'s rows as a Markdown table, with the mean over generations last."""
    keys = ["split_half_rho", "dense_split_half_rho", "told_tiebreak", "told_weighted", "dense_mean"]
    keys = [k for k in keys if any(k in r for r in rows)]
    lines = ["| generation | N | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
    for r in rows:
        lines.append(f"| {r['generation']} | {r['prompts']} | " + " | ".join(f"{r.get(k, np.nan):.2f}" for k in keys) + " |")
    means = [np.nanmean([r.get(k, np.nan) for r in rows]) for k in keys]
    lines.append("| mean | | " + " | ".join(f"{m:.2f}" for m in means) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    """Run the calibration and print the table (module docstring). Returns the table."""
    from engine.lab.threads import one_blas_thread

    ap = argparse.ArgumentParser(prog="python -m engine.lab.calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=16, help="run seeds at D 240 (default 16)")
    ap.add_argument("--seeds-1920", type=int, default=4, help="run seeds at D 1920 (default 4; ~1 s each)")
    ap.add_argument("--landscape-seed", type=int, default=5,
                    help="the landscape instance (default 5, as conf/lab.yaml)")
    ap.add_argument("--options", default="{}", help="knobs as JSON, e.g. '{\"chaos\": 0.5}' (MinibatchParams)")
    ap.add_argument("--real-run", default=None, help="an essa train run directory: print its signal diagnostics "
                    "(0/1 and dense split-half rho, the rho a dense tie-break or weighted term would tell) instead")
    ap.add_argument("--dense-weight", type=float, default=2.0, help="rollout.dense_weight for --real-run (default 2)")
    args = ap.parse_args(argv)
    if args.real_run:
        out = real_signal_table(real_signal(args.real_run, args.dense_weight))
        print(out)
        return out
    options = json.loads(args.options)
    with one_blas_thread():
        sims = [simulate(d, list(range(n)), args.landscape_seed, options)
                for d, n in ((240, args.seeds), (1920, args.seeds_1920))]
    out = table(statistics(sims[0]), statistics(sims[1]), args.seeds, args.seeds_1920)
    print(out)
    return out


if __name__ == "__main__":
    main()
