"""The off-task drift study (issue 28): one Markdown table and one PNG from an ``essa eval
drift.enabled=true`` directory whose conditions are named ``<method>_s<seed>`` (plus a control).

    .venv/bin/python tools/drift_study.py EVAL_DIR [--control sft] [--accuracy OTHER_EVAL_DIR ...] [--out DIR]

Per condition: on-task greedy accuracy and its paired difference from the control (same engine call,
same problems; Newcombe interval, exact McNemar p: engine/results/stats.py), KL(reference || condition)
on every prompt set (token-weighted, nats per token; the first reference of the eval unless
``--reference``), and greedy accuracy on the tasks of ``--accuracy`` eval directories (same condition
names). Then, per seed, a paired test of ``essa`` against each other method. The figure: paired gain
against the mean KL over the sets other than the eval's task, one point per condition, a colour per
method. Writes DIR/drift_study.md and DIR/drift_study.png (atomically) and prints the table.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from engine import io
from engine.results.stats import paired_comparison


def load_eval(d: Path) -> tuple[dict, dict[str, dict[str, float]]]:
    """(eval_summary.json, {condition: {problem_id: greedy_correct}}) of an eval directory."""
    summary = json.loads((d / "eval_summary.json").read_text())
    per: dict[str, dict[str, float]] = {}
    for r in pq.read_table(d / "eval_problems.parquet", columns=["condition", "problem_id", "greedy_correct"]).to_pylist():
        per.setdefault(r["condition"], {})[r["problem_id"]] = float(r["greedy_correct"] or 0.0)
    return summary, per


def paired(per: dict, treatment: str, control: str) -> dict:
    ids = sorted(per[control])
    return paired_comparison(np.array([per[treatment][i] for i in ids]), np.array([per[control][i] for i in ids]))


def fmt_pair(p: dict) -> str:
    return f"{100 * p['diff']:+.1f} [{100 * p['ci_low']:+.1f}, {100 * p['ci_high']:+.1f}], p {p['p_value']:.2g}"


def method_of(cond: str) -> str:
    m = re.fullmatch(r"(.+)_s(\d+)", cond)
    return m.group(1) if m else cond


def table(summary: dict, per: dict, drift: dict, others: dict, control: str) -> list[str]:
    """The Markdown rows: one per condition (the control first)."""
    sets = list(drift)
    head = ["condition", "on-task accuracy", f"paired vs {control}, points [95 % CI], p",
            *[f"KL {s}" for s in sets], *[f"accuracy {t}" for t in others]]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    conds = [control] + sorted(c for c in summary["conditions"] if c != control)
    for c in conds:
        acc = summary["conditions"][c]["greedy_accuracy"]
        pair = "-" if c == control else fmt_pair(paired(per, c, control))
        kls = [f"{drift[s][c]['kl_token']:.4f}" if c in drift[s] else "-" for s in sets]
        accs = [f"{o['conditions'][c]['greedy_accuracy']:.3f}" if c in o["conditions"] else "-" for o in others.values()]
        rows.append("| " + " | ".join([c, f"{acc:.3f}", pair, *kls, *accs]) + " |")
    return rows


def between_methods(per: dict, anchor: str = "essa") -> list[str]:
    """Per seed: ``anchor`` against each other method of that seed (paired, same problems)."""
    lines = []
    for c in sorted(per):
        m = re.fullmatch(rf"{re.escape(anchor)}_s(\d+)", c)
        if not m:
            continue
        for other in sorted(o for o in per if o != c and o.endswith(f"_s{m.group(1)}")):
            lines.append(f"- seed {m.group(1)}: {c} - {other}: {fmt_pair(paired(per, c, other))}")
    return lines


def figure(summary: dict, per: dict, drift: dict, control: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    off = [s for s in drift if s != summary.get("task")] or list(drift)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    methods = sorted({method_of(c) for c in summary["conditions"] if c != control})
    for i, m in enumerate(methods):
        pts = [(np.mean([drift[s][c]["kl_token"] for s in off]), 100 * paired(per, c, control)["diff"])
               for c in summary["conditions"] if c != control and method_of(c) == m and all(c in drift[s] for s in off)]
        if pts:
            ax.scatter(*zip(*pts), color=f"C{i}", label=m)
    ax.axhline(0, color="0.6", linewidth=0.8)
    ax.set_xlabel(f"off-task KL(reference || adapter), nats per token, mean over {', '.join(off)}")
    ax.set_ylabel(f"on-task paired gain over {control}, points")
    ax.set_title("Gain against off-task drift, one point per run")
    ax.legend()
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("eval_dir", type=Path)
    ap.add_argument("--control", default="sft", help="the condition gains are paired against")
    ap.add_argument("--reference", default=None, help="drift reference (default: the eval's first)")
    ap.add_argument("--accuracy", type=Path, nargs="*", default=[], help="eval dirs of other tasks (same conditions)")
    ap.add_argument("--out", type=Path, default=None, help="default: EVAL_DIR")
    args = ap.parse_args(argv)
    summary, per = load_eval(args.eval_dir)
    if args.control not in per:
        raise SystemExit(f"--control {args.control}: not a condition of {args.eval_dir} ({', '.join(sorted(per))})")
    drift_all = json.loads((args.eval_dir / "eval_drift.json").read_text())
    ref = args.reference or next(iter(drift_all))
    others = {json.loads((d / "eval_summary.json").read_text())["task"]: json.loads((d / "eval_summary.json").read_text())
              for d in args.accuracy}
    lines = [f"KL against `{ref}`; task `{summary.get('task')}`; {len(per[args.control])} problems", "",
             *table(summary, per, drift_all[ref], others, args.control), "", *between_methods(per)]
    out = args.out or args.eval_dir
    out.mkdir(parents=True, exist_ok=True)
    io.atomic_write_bytes(out / "drift_study.md", ("\n".join(lines) + "\n").encode())
    figure(summary, per, drift_all[ref], args.control, out / "drift_study.png")
    print("\n".join(lines))
    print(f"\nwritten: {out / 'drift_study.md'}, {out / 'drift_study.png'}")


if __name__ == "__main__":
    main()
