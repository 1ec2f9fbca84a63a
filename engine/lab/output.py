"""The lab's outputs in its run directory, each written atomically (engine/io.py): ``lab.parquet`` (one
row per setting x seed x generation, engine/lab/runner.py ``COLUMNS``), ``lab_summary.json``
(engine/lab/summary.py), ``lab_progress.png`` (progress against evaluations, mean over seeds with the
95 % t interval; matplotlib Agg in the style of engine/results/report.py) and the printed table."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from engine import io
from engine.lab.summary import t_interval

FIGURE = "lab_progress.png"


def _f(v, fmt: str = "+.3f") -> str:
    return "-" if v is None or not np.isfinite(v) else format(v + 0.0, fmt)


def _ci(d: dict | None, fmt: str = "+.3f") -> str:
    if d is None:
        return "-"
    return f"{_f(d['mean'], fmt)} [{_f(d['ci_low'], fmt)}, {_f(d['ci_high'], fmt)}]"


def _row(k: int, s: dict, oracle: dict | None, width: int) -> str:
    """One setting's line of the table."""
    fmt = "+.3f" if s["gain"] is not None else "+.4g"
    vs = "(reference)" if k == 0 else _ci((s["vs_reference"] or {}).get("score"), fmt)
    if s["gain"] is None:  # no held-out set: the final true fitness
        return f"{s['label']:<{width}} {_ci(s['true_final'], '.4g'):>34}  {vs:>32}"
    final = np.mean([e["held_out_final"] for e in s["per_seed"]])
    ps = " ".join(f"{e['paired']['p_value']:.2g}" for e in s["per_seed"])
    orc = _f(oracle["gain"]) if oracle else "-"
    share = _f((s.get("oracle_share") or {}).get("mean"), "+.2f")
    cos = _f((s.get("cos_oracle") or {}).get("mean"), "+.2f")
    evals = s["evaluations"]["mean"] / 1000
    return (f"{s['label']:<{width}} {final:>8.3f}  {_ci(s['gain']):>26}  {vs:>26}  {orc:>7}  {share:>6}  "
            f"{cos:>6}  {evals:>6.1f}k  {s['wins']:>2}/{len(s['per_seed']):<2}  {ps}")


def format_table(summary: dict) -> str:
    """The printed table: per setting the final held-out accuracy (mean over seeds), the gain over genome
    zero with its 95 % interval, the difference to setting 0 paired by seed, the oracle's gain, the share of
    it captured and the mean genome's cosine with the oracle's genome (means over seeds), the seeds
    with a significant gain and each seed's McNemar p (landscapes without a held-out set: the final true
    fitness instead)."""
    first, seeds = summary["settings"][0], summary["seeds"]
    width = max(12, *(len(s["label"]) for s in summary["settings"]))  # whole labels: a cut one misreads (0.1 -> 0.)
    head = (f"\nstrategy lab: {first['landscape']} landscape, {first['generations']} generations x {len(seeds)} seeds "
            f"({', '.join(map(str, seeds))}), {summary['wall_s']:.1f} s")
    if first["gain"] is None:
        lines = [head, "final true fitness of the mean genome (mean over seeds [95 % t interval]); "
                       "vs setting 0: paired by seed",
                 f"{'setting':<{width}} {'final true fitness [95 % CI]':>34}  {'vs setting 0 [95 % CI]':>32}"]
    else:
        zero = first["per_seed"][0]["held_out_start"]
        lines = [head, f"held-out: genome zero {zero:.3f}; gain = final mean genome minus genome zero on the same "
                       "held-out problems (mean over seeds [95 % t interval]); vs setting 0: the gain difference "
                       "paired by seed; oracle: the landscape's best by direct optimisation; share: gain / oracle gain and "
                       "cos: cosine of the mean genome with the oracle's (means over seeds); evals: candidate x problem "
                       "evaluations spent (mean over seeds); p: exact McNemar per seed",
                 f"{'setting':<{width}} {'held-out':>8}  {'gain [95 % CI]':>26}  {'vs setting 0 [95 % CI]':>26}  "
                 f"{'oracle':>7}  {'share':>6}  {'cos':>6}  {'evals':>7}  {'p<.05':>5}  McNemar p per seed"]
    lines += [_row(k, s, o, width) for k, (s, o) in enumerate(zip(summary["settings"], summary["oracles"]))]
    return "\n".join(lines)


def _curves(rows: list[dict], k: int, key: str, start: float) -> tuple[np.ndarray, ...]:
    """(evaluations, mean, low, high) of column ``key`` for setting ``k``, from the start value at 0: one point
    per generation, at the seeds' mean evaluations; a seed that ``budget_evaluations`` stopped early keeps its
    last row, so the last point is every seed's final."""
    by_seed: dict[int, list[dict]] = {}
    for r in rows:
        if r["setting"] == k:
            by_seed.setdefault(r["seed"], []).append(r)
    runs = [sorted(rs, key=lambda r: r["generation"]) for rs in by_seed.values()]
    xs, stats = [0.0], [{"mean": start, "ci_low": start, "ci_high": start}]
    for g in range(max((len(rs) for rs in runs), default=0)):
        at = [rs[min(g, len(rs) - 1)] for rs in runs]
        xs.append(float(np.mean([r["evaluations"] for r in at])))
        stats.append(t_interval([r[key] for r in at]))
    return (np.asarray(xs), *(np.asarray([s[q] for s in stats], dtype=float) for q in ("mean", "ci_low", "ci_high")))


def progress_figure(rows: list[dict], summary: dict):
    """Progress against evaluations, one line per setting (mean over seeds, 95 % t band): held-out accuracy
    of the mean genome where it is scored every generation, and its true fitness (minibatch: expected
    accuracy; likelihood: held-out log-likelihood; classic: -f)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    settings = summary["settings"]
    panels = [("true_fitness", f"{settings[0]['true_fitness_name']} of the mean genome")]
    if any(np.isfinite(r["held_out"]) for r in rows):
        panels.insert(0, ("held_out", "held-out accuracy of the mean genome"))
    fig = Figure(figsize=(6.0 * len(panels), 4.4), dpi=110, layout="constrained")
    for i, (key, ylabel) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for k, s in enumerate(settings):
            first = s["per_seed"][0]
            x, m, lo, hi = _curves(rows, k, key, first["held_out_start"] if key == "held_out" else first["true_start"])
            color = colormaps["tab10"](k % 10)
            ax.plot(x, m, color=color, marker="o", markersize=3, label=s["label"])
            ax.fill_between(x, lo, hi, color=color, alpha=0.18 if len(settings) <= 3 else 0.09, linewidth=0)
        ax.set_xlabel(f"evaluations ({'candidate x problem' if settings[0]['prompts'] > 1 else 'candidates'})")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    fig.axes[0].set_title(f"{settings[0]['landscape']}: mean over {len(summary['seeds'])} seeds, 95 % interval")
    fig.axes[-1].legend(fontsize=7, loc="best")
    return fig


def write_outputs(run_dir: str | Path, rows: list[dict], summary: dict) -> list[Path]:
    """lab.parquet, lab_summary.json and lab_progress.png into ``run_dir`` (atomic). Returns the paths."""
    run_dir = Path(run_dir)
    paths = [io.write_parquet(run_dir / "lab.parquet", rows), io.write_json(run_dir / "lab_summary.json", summary, strict=True)]
    fig = progress_figure(rows, summary)
    with io.atomic_file(run_dir / FIGURE) as tmp:
        fig.savefig(tmp, format="png")
    paths.append(run_dir / FIGURE)
    return paths

