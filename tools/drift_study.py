"""The off-task drift study (docs/results/grpo.md): one Markdown table and one PNG from an ``essa eval
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
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from engine import io
from engine.results.stats import paired_comparison


class StudyError(ValueError):
    """Input the study cannot use; printed as one line."""


def read_json(path: Path) -> dict:
    """:func:`engine.io.read_json`, its errors as StudyError with the fix."""
    if not path.is_file():
        raise StudyError(f"{path}: missing; pass the directory of an `essa eval drift.enabled=true` run")
    try:
        return io.read_json(path)
    except ValueError as e:
        raise StudyError(f"{e}; re-run the eval") from None


def load_eval(d: Path) -> tuple[dict, dict[str, dict[str, float]]]:
    """(eval_summary.json, {condition: {problem_id: greedy_correct}}) of an eval directory; only the
    conditions both files have.

    Raises:
        StudyError: a missing or unreadable file, or a problem scored twice for one condition.
    """
    summary = read_json(d / "eval_summary.json")
    if not isinstance(summary.get("conditions"), dict) or "task" not in summary:
        raise StudyError(f"{d / 'eval_summary.json'}: no task or conditions; is it an essa eval directory?")
    path = d / "eval_problems.parquet"
    if not path.is_file():
        raise StudyError(f"{path}: missing; pass the directory of an `essa eval` run")
    try:
        rows = pq.read_table(path, columns=["condition", "problem_id", "greedy_correct"]).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
        raise StudyError(f"{path}: unreadable ({type(e).__name__}); re-run the eval") from None
    per: dict[str, dict[str, float]] = {}
    for r in rows:
        got = per.setdefault(r["condition"], {})
        if r["problem_id"] in got:
            raise StudyError(f"{path}: problem {r['problem_id']} appears twice for {r['condition']}")
        got[r["problem_id"]] = float(r["greedy_correct"] or 0.0)
    keep = set(per) & set(summary["conditions"])
    summary["conditions"] = {c: v for c, v in summary["conditions"].items() if c in keep}
    return summary, {c: v for c, v in per.items() if c in keep}


def paired(per: dict, treatment: str, control: str) -> dict:
    """Paired comparison on the control's problems (the treatment must have scored all of them)."""
    ids = sorted(per[control])
    missing = [i for i in ids if i not in per[treatment]]
    if missing:
        raise StudyError(f"{treatment} did not score {len(missing)} of {control}'s problems (e.g. {missing[0]}); "
                         "evaluate all conditions in one essa eval call")
    return paired_comparison(np.array([per[treatment][i] for i in ids]), np.array([per[control][i] for i in ids]))


def fmt_pair(p: dict) -> str:
    return f"{100 * p['diff']:+.1f} [{100 * p['ci_low']:+.1f}, {100 * p['ci_high']:+.1f}], p {p['p_value']:.2g}"


BASE = "no_adapter"  # essa eval's base-model condition: left out of the figure (its gain is far below the runs')


def method_of(cond: str) -> str:
    m = re.fullmatch(r"(.+)_s(\d+)", cond)
    return m.group(1) if m else cond


def _num(v, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def table(summary: dict, vs_control: dict, drift: dict, others: dict, control: str) -> list[str]:
    """The Markdown rows: one per condition (the control first); ``vs_control``: {condition: paired vs control}."""
    sets = list(drift)
    head = ["condition", "on-task accuracy", f"paired vs {control}, points [95 % CI], p",
            *[f"KL {s}" for s in sets], *[f"accuracy {t}" for t in others]]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    conds = [control] + sorted(c for c in summary["conditions"] if c != control)
    for c in conds:
        acc = summary["conditions"][c]["greedy_accuracy"]
        pair = "-" if c == control else fmt_pair(vs_control[c])
        kls = [_num(drift[s].get(c, {}).get("kl_token"), 4) for s in sets]
        accs = [_num(o["conditions"].get(c, {}).get("greedy_accuracy"), 3) for o in others.values()]
        rows.append("| " + " | ".join([c, _num(acc, 3), pair, *kls, *accs]) + " |")
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


def figure(summary: dict, vs_control: dict, drift: dict, control: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    off = [s for s in drift if s != summary.get("task")] or list(drift)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    methods = sorted({method_of(c) for c in summary["conditions"] if c not in (control, BASE)})
    for i, m in enumerate(methods):
        pts = [(np.mean([drift[s][c]["kl_token"] for s in off]), 100 * vs_control[c]["diff"])
               for c in summary["conditions"] if c != control and method_of(c) == m
               and all(drift[s].get(c, {}).get("kl_token") is not None for s in off)]
        if pts:
            ax.scatter(*zip(*pts), color=f"C{i}", label=m)
    ax.axhline(0, color="0.6", linewidth=0.8)
    ax.set_xlabel(f"KL(reference || adapter), nats/token, mean over {', '.join(off)}", fontsize=8)
    ax.set_ylabel(f"on-task paired gain over {control}, points")
    ax.set_title("Gain against off-task drift, one point per run")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    with io.atomic_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)


def study(args) -> tuple[list[str], dict, dict, dict]:
    """The Markdown lines, and what the figure needs: (lines, summary, {condition: paired vs control}, drift
    of the reference).

    Raises:
        StudyError: unusable input (one line naming it and the fix).
    """
    summary, per = load_eval(args.eval_dir)
    if args.control not in per:
        raise StudyError(f"--control {args.control}: not a condition of {args.eval_dir} ({', '.join(sorted(per)) or 'none'})")
    drift_all = read_json(args.eval_dir / "eval_drift.json")
    ref = args.reference or next(iter(drift_all), None)
    if ref not in drift_all or not drift_all[ref]:
        raise StudyError(f"--reference {ref}: no drift results for it in {args.eval_dir / 'eval_drift.json'} "
                         f"(references: {', '.join(drift_all) or 'none'})")
    others: dict[str, dict] = {}
    for d in args.accuracy:
        other, _ = load_eval(d)
        if other["task"] in others or other["task"] == summary["task"]:
            raise StudyError(f"--accuracy {d}: task {other['task']} is given twice (or is the eval's own task)")
        others[other["task"]] = other
    vs_control = {c: paired(per, c, args.control) for c in summary["conditions"] if c != args.control}
    lines = [f"KL against `{ref}`; task `{summary['task']}`; {len(per[args.control])} problems", "",
             *table(summary, vs_control, drift_all[ref], others, args.control), "", *between_methods(per)]
    return lines, summary, vs_control, drift_all[ref]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("eval_dir", type=Path)
    ap.add_argument("--control", default="sft", help="the condition gains are paired against")
    ap.add_argument("--reference", default=None, help="drift reference (default: the eval's first)")
    ap.add_argument("--accuracy", type=Path, nargs="*", default=[], help="eval dirs of other tasks (same conditions)")
    ap.add_argument("--out", type=Path, default=None, help="default: EVAL_DIR")
    args = ap.parse_args(argv)
    out = args.out or args.eval_dir
    try:
        lines, summary, vs_control, drift = study(args)
    except StudyError as e:
        raise SystemExit(f"drift_study: error: {e}") from None
    try:  # the figure first: report.md never names a figure that was not written
        out.mkdir(parents=True, exist_ok=True)
        figure(summary, vs_control, drift, args.control, out / "drift_study.png")
        io.atomic_write_bytes(out / "drift_study.md", ("\n".join(lines) + "\n").encode())
    except OSError as e:
        raise SystemExit(f"drift_study: error: --out {out}: cannot write there ({e.strerror or e}); "
                         "pass a writable directory") from None
    print("\n".join(lines))
    print(f"\nwritten: {out / 'drift_study.md'}, {out / 'drift_study.png'}")


if __name__ == "__main__":
    main()
