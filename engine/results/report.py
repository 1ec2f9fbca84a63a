"""``essa report RUN_DIR [RUN_DIR ...]``: PNG figures and a Markdown summary of run directories.

Reads the run-directory files of docs/ARCHITECTURE.md: ``run.json`` (label, method),
``metrics.parquet`` (one row per ES generation), ``validation.parquet`` (held-out accuracy; GRPO runs
write the same schema with step = training step and may have no metrics.parquet) and the results of
``essa eval`` (``eval_summary.json`` in the run dir, in ``<run>/eval/`` or in ``<run>/eval_*/``; an
``essa eval`` output directory is itself accepted as a run dir).

Figures (matplotlib, Agg; a figure whose data no run has is skipped, and report.md says so):

| file | x | y |
|---|---|---|
| ``fitness.png`` | generation | fitness: mean line, min-max band, best so far (dashed), centre (dotted) |
| ``signal.png`` | generation | split-half rank correlation of candidate fitness (near 0 = the ranking is noise) |
| ``sigma.png`` | generation | strategy step size sigma (log scale) |
| ``val_accuracy_generation.png`` | generation / training step | held-out accuracy per condition |
| ``val_accuracy_wallclock.png`` | wall-clock seconds since the run started | held-out accuracy per condition |
| ``passk.png`` | k (log2) | pass@k of each evaluated condition (Chen et al. 2021 estimator), shaded: bootstrap 95 % interval of the mean over problems (``pass_at_k_ci95``) |
| ``passk_diff.png`` | k (log2) | pass@k of each condition minus the eval's control on the problems both score, shaded: paired bootstrap 95 % interval (``pass_at_k_vs_control``), zero line |
| ``throughput.png`` | generation | generated tokens per second of generate time |
| ``paired_gain.png`` | accuracy difference | after ES (mean, best) minus the SFT warm start on the same held-out problems, 95 % interval and McNemar p (summary.json) |

``essa report multirun/<time>`` (one Hydra sweep directory) prints one table of all its jobs
(overrides, status, final accuracy of the mean genome with its 95 % interval when summary.json has
``val_ci95``, wall time), best first, and writes it into ``<sweep>/report/report.md`` above the
figures of every job, overlaid (:func:`make_sweep_report`).

Several runs are overlaid on one axis, one colour per run, labelled by ``run.json``'s label
(method + overrides), so ESSA and baseline runs compare directly. In the accuracy figures the
``mean`` curve of an ES run starts at the ``sft`` point of step 0: genome zero decodes to the warm
start adapter, so the search distribution's mean *is* the SFT adapter before generation 0.
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from engine import io
from engine.results.stats import GRPO_METHODS, ordered

log = logging.getLogger("essa.report")
# Drawing log-scale tick labels, mathtext looks for STIX / Computer Modern fonts and logs about 20
# "findfont: ... not found" warnings per report where they are not installed; its DejaVu fallback draws
# the same labels, so only errors from the font manager are shown.
logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)

RUN_FILES = ("run.json", "metrics.parquet", "validation.parquet", "eval_summary.json", "summary.json")
CONDITION_STYLE = {  # marker, linestyle per validation condition
    "no_adapter": ("x", ":"), "sft": ("s", ":"), "mean": ("o", "-"), "best": ("*", "--"),
}
FIGURES = {  # file stem -> title (also the Markdown caption)
    "fitness": "Fitness per generation",
    "signal": "Fitness signal: split-half rank correlation",
    "sigma": "Strategy step size",
    "val_accuracy_generation": "Held-out accuracy per generation",
    "val_accuracy_wallclock": "Held-out accuracy against wall-clock time",
    "passk": "pass@k (unbiased estimator)",
    "passk_diff": "pass@k difference against the control (paired bootstrap 95 % interval)",
    "throughput": "Generation throughput",
    "paired_gain": "Gain over the SFT warm start on the same problems (95 % interval)",
    "drift": "On-task accuracy against off-task drift",
}


@dataclass
class RunData:
    """What the report needs of one run directory.

    Attributes:
        path: the run directory.
        label: legend name (run.json label, else the eval label, else the directory name).
        method: essa | grpo | f-grpo | ... ("" when unknown).
        meta: run.json contents ({} when absent).
        metrics: metrics.parquet rows (one per generation, or per optimiser step of a GRPO run; sorted).
        validation: validation.parquet rows (sorted by step).
        evals: (eval directory, eval_summary.json dict) pairs.
        summary: summary.json of a finished train / grpo run ({} when absent).
    """

    path: Path
    label: str
    method: str = ""
    meta: dict = field(default_factory=dict)
    metrics: list[dict] = field(default_factory=list)
    validation: list[dict] = field(default_factory=list)
    evals: list[tuple[Path, dict]] = field(default_factory=list)
    summary: dict = field(default_factory=dict)


def _eval_dirs(path: Path) -> list[Path]:
    cands = [path, path / "eval", *sorted(p for p in path.glob("eval_*") if p.is_dir())]
    return [d for d in cands if (d / "eval_summary.json").is_file()]


def _read_json(path: Path) -> dict:
    """A run file's JSON object. Raises ValueError naming the file when it is not one."""
    try:
        obj = io.read_json(path)
    except ValueError as e:
        raise ValueError(f"{e}; fix or remove the file, or leave this run out") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path} holds a JSON {type(obj).__name__}, not an object; fix or remove the file")
    return obj


PASSK_TABLES = ("pass_at_k", "pass_at_k_ci95", "pass_at_k_problems", "pass_at_k_vs_control")
"""A condition's entries of eval_summary.json keyed by k (``{"1": ..., "4": ...}``; essa eval)."""


def _json_type(v) -> str:
    """The JSON name of a parsed value's type (null, boolean, number, string, array, object)."""
    return {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(v), type(v).__name__)


def _k_table_error(table, name: str, numbers: bool = False) -> str | None:
    """Why ``table`` (``name`` in the summary) is no ``{str(k): value}`` object (``numbers``: with number or
    null values), or None (also for None)."""
    if table is None:
        return None
    if not isinstance(table, dict):
        return f"{name} must be an object keyed by k, not {_json_type(table)}"
    bad = next((k for k in table if not str(k).strip().isdigit()), None)
    if bad is not None:
        return f"{name} has key {bad!r}, which is no k (a positive integer)"
    bad = next((k for k, v in table.items() if numbers and v is not None
                and (isinstance(v, bool) or not isinstance(v, (int, float)))), None)
    return None if bad is None else f"{name}.{bad} must be a number or null, not {table[bad]!r}"


def eval_summary_error(summary: dict) -> str | None:
    """Why an eval_summary.json object cannot be reported (the field and what is wrong), or None: the shape
    the report reads (``conditions`` of objects, their pass@k tables keyed by k, ``pass_at_k_pairs`` of
    objects); any field may be absent (older summaries) or null where essa eval writes null."""
    conds = summary.get("conditions", {})
    if not isinstance(conds, dict):
        return f"'conditions' must be an object (condition -> metrics), not {_json_type(conds)}"
    for cond, res in conds.items():
        if not isinstance(res, dict):
            return f"conditions.{cond} must be an object of metrics, not {_json_type(res)}"
        for key in PASSK_TABLES:
            why = _k_table_error(res.get(key), f"conditions.{cond}.{key}", numbers=key == "pass_at_k")
            if why:
                return why
    pairs = summary.get("pass_at_k_pairs") or []
    if not isinstance(pairs, list):
        return f"pass_at_k_pairs must be a list, not {_json_type(pairs)}"
    for i, pair in enumerate(pairs):
        if not isinstance(pair, dict):
            return f"pass_at_k_pairs[{i}] must be an object, not {_json_type(pair)}"
        why = _k_table_error(pair.get("pass_at_k"), f"pass_at_k_pairs[{i}].pass_at_k")
        if why:
            return why
    return None


def _read_eval_summary(path: Path) -> dict:
    """An eval_summary.json. Raises ValueError naming the file and the field when :func:`_read_json` fails or
    the object has not the shape the report reads (:func:`eval_summary_error`)."""
    summary = _read_json(path)
    why = eval_summary_error(summary)
    if why:
        raise ValueError(f"{path}: {why}; fix or remove the file, or leave this run out")
    return summary


def _read_parquet(path: Path) -> list[dict]:
    """A run file's Parquet rows ([] when absent). Raises ValueError naming the file when pyarrow cannot read it."""
    try:
        return io.read_rows(path)
    except ValueError as e:
        raise ValueError(f"{e}; fix or remove the file, or leave this run out") from None


def _rows_with(path: Path, keys: tuple[str, ...],
               writers: str = "essa train, grpo and eval write one per row") -> list[dict]:
    """:func:`_read_parquet`'s rows, every one holding a value for each of ``keys`` (the columns the report
    orders and groups by). Raises ValueError naming the file, the column and ``writers`` (who writes it)
    otherwise."""
    rows = _read_parquet(path)
    for key in keys:
        if any(r.get(key) is None for r in rows):
            raise ValueError(f"{path} has rows without a '{key}' ({writers}); "
                             f"fix or remove the file, or leave this run out")
    return rows


def _metrics_order(method: str) -> str:
    """The metrics.parquet column a run's rows are ordered by: ``step`` for :data:`GRPO_METHODS`, else
    ``generation``."""
    return "step" if method in GRPO_METHODS else "generation"


def load_run(path: str | Path) -> RunData:
    """Read one run directory.

    Raises:
        ValueError: the path is not a directory holding any of run.json, metrics.parquet,
            validation.parquet or eval_summary.json (also under eval/ or eval_*/), or one of
            those files is corrupt (the message names it), or a row has no ``generation`` (metrics;
            ``step`` for a GRPO run) or no ``condition`` or ``step`` (validation), or an eval_summary.json
            has not the shape the report reads (:func:`eval_summary_error`, the message names the field).
    """
    path = Path(path)
    evals = _eval_dirs(path) if path.is_dir() else []
    if not path.is_dir() or (not any((path / f).is_file() for f in RUN_FILES) and not evals):
        raise ValueError(f"{path} is not a run directory (no {', '.join(RUN_FILES)}); pass a directory "
                         f"written by essa train, essa grpo or essa eval")
    meta = _read_json(path / "run.json") if (path / "run.json").is_file() else {}
    summaries = [(d, _read_eval_summary(d / "eval_summary.json")) for d in evals]
    label = meta.get("label") or (summaries[0][1].get("label") if summaries and not meta else None) or path.name
    method = str(meta.get("method") or "").lower()
    order = _metrics_order(method)
    writers = (f"run.json says method '{method or '-'}': essa train writes a 'generation' per row; essa grpo a "
               f"'step', read when run.json says method grpo or f-grpo")
    metrics = sorted(_rows_with(path / "metrics.parquet", (order,), writers), key=lambda r: r[order])
    validation = sorted(_rows_with(path / "validation.parquet", ("condition", "step")),
                        key=lambda r: (r["step"], r.get("wall_s") or 0))
    summary = {}
    if (path / "summary.json").is_file():
        try:  # only the paired-gain figure needs it: a damaged one costs that figure, not the report
            summary = _read_json(path / "summary.json")
        except ValueError as e:
            log.warning("report: %s", e)
    return RunData(path, str(label), method, meta, metrics, validation, summaries, summary)


def _col(rows: list[dict], key: str) -> np.ndarray:
    """Column ``key`` of ``rows`` as float64 (None -> NaN); empty when the key is missing everywhere."""
    if not rows or all(r.get(key) is None for r in rows):
        return np.array([], dtype=np.float64)
    return np.array([np.nan if r.get(key) is None else float(r[key]) for r in rows], dtype=np.float64)


def _unique_labels(runs: list[RunData]) -> list[str]:
    labels = [r.label for r in runs]
    return [f"{lab} ({r.path.name})" if labels.count(lab) > 1 else lab for lab, r in zip(labels, runs)]


def _colors(n: int) -> list:
    from matplotlib import colormaps
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    # tab20's dark shades are tab10's hues: runs 1-10 keep them, runs 11-20 take the light shades
    # (past 20 they repeat; the legend still names every run)
    order = list(range(0, 20, 2)) + list(range(1, 20, 2))
    return [colormaps["tab20"](order[i % 20]) for i in range(n)]


def _new_axes(title: str, xlabel: str, ylabel: str):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(7.0, 4.2), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if xlabel.startswith("generation"):
        from matplotlib.ticker import MaxNLocator
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig, ax


def _finish(fig, ax):
    """Legend inside the axes when it is small, else below them (long override labels wrap)."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return fig
    labels = [textwrap.fill(lab, 100, subsequent_indent="    ") for lab in labels]
    n_lines = sum(lab.count("\n") + 1 for lab in labels)
    if n_lines <= 6 and max(len(lab) for lab in labels) <= 60:
        ax.legend(handles, labels, fontsize=7, loc="best")
    else:
        fig.set_size_inches(7.0, 4.2 + 0.15 * n_lines)
        fig.legend(handles, labels, fontsize=7, loc="outside lower center")
    return fig


def legend_texts(fig) -> list[str]:
    """The legend entries of a report figure (inside the axes or below them)."""
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    return [t.get_text() for leg in legends for t in leg.get_texts()]


def _marker(n_points: int) -> dict:
    return {"marker": "o", "markersize": 3} if n_points <= 40 else {}


# --- figures: each returns a Figure, or None when no run has the data ---------------------------

def fig_fitness(runs: list[RunData], labels: list[str], colors: list):
    """Mean fitness per generation with the min-max band and the best fitness so far."""
    have = [(r, lab, c) for r, lab, c in zip(runs, labels, colors) if _col(r.metrics, "fitness_mean").size]
    if not have:
        return None
    fig, ax = _new_axes(FIGURES["fitness"], "generation", "fitness (mean reward on the minibatch)")
    for r, lab, c in have:
        g, mean = _col(r.metrics, "generation"), _col(r.metrics, "fitness_mean")
        lo, hi = _col(r.metrics, "fitness_min"), _col(r.metrics, "fitness_max")
        ax.plot(g, mean, color=c, label=f"{lab}: mean", **_marker(len(g)))
        if lo.size and hi.size:
            ax.fill_between(g, lo, hi, color=c, alpha=0.18, linewidth=0, label=f"{lab}: min-max")
            best = np.fmax.accumulate(hi)
            ax.plot(g, best, color=c, linestyle="--", label=f"{lab}: best so far")
        center = _col(r.metrics, "fitness_center")
        if center.size == g.size and np.isfinite(center).any():
            ax.plot(g, center, color=c, linestyle=":", marker="s", markersize=3, label=f"{lab}: centre (mean genome)")
    return _finish(fig, ax)


def _per_generation(runs, labels, colors, key: str, name: str, ylabel: str):
    """One line per run of metrics column ``key`` against generation; None when no run has it.

    Returns:
        (fig, ax, values) with ``values`` the plotted columns, or None.
    """
    have = [(r, lab, c) for r, lab, c in zip(runs, labels, colors) if _col(r.metrics, key).size]
    if not have:
        return None
    fig, ax = _new_axes(FIGURES[name], "generation", ylabel)
    values = []
    for r, lab, c in have:
        g, v = _col(r.metrics, "generation"), _col(r.metrics, key)
        ax.plot(g, v, color=c, label=lab, **_marker(len(g)))
        values.append(v)
    return fig, ax, values


def fig_signal(runs, labels, colors):
    """Split-half rank correlation of candidate fitness per generation (is the ranking signal?)."""
    out = _per_generation(runs, labels, colors, "split_half_rho", "signal", "split-half rank correlation of fitness")
    if out is None:
        return None
    fig, ax, _ = out
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_ylim(-1, 1)
    return _finish(fig, ax)


def fig_sigma(runs, labels, colors):
    """Step size sigma per generation (log y when every value is positive)."""
    out = _per_generation(runs, labels, colors, "sigma", "sigma", "step size sigma (genome units)")
    if out is None:
        return None
    fig, ax, values = out
    if all(np.all(s[np.isfinite(s)] > 0) for s in values):
        ax.set_yscale("log")
    return _finish(fig, ax)


def fig_throughput(runs, labels, colors):
    """Generated tokens per second of generate time, per generation."""
    out = _per_generation(runs, labels, colors, "tokens_per_s", "throughput", "tokens / s (population generate)")
    if out is None:
        return None
    fig, ax, _ = out
    ax.set_ylim(bottom=0)
    return _finish(fig, ax)


def validation_series(run: RunData, x: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """condition -> (x values, accuracy), x = ``step`` or ``wall_s``. ``mean`` starts at step 0 (wall 0)
    with the ``sft`` accuracy (genome zero is the warm start), measured at step 0 or, when the run scores
    the warm start only in its final engine call, there."""
    by: dict[str, list[dict]] = {}
    for row in run.validation:
        by.setdefault(str(row.get("condition")), []).append(row)
    if "mean" in by and "sft" in by and not any(r.get("step") == 0 for r in by["mean"]):
        first = min(by["sft"], key=lambda r: r.get("step") or 0)
        start = first if first.get("step") == 0 else {**first, "step": 0, "wall_s": 0.0}
        by["mean"] = [start] + by["mean"]
    return {c: (_col(rows, x), _col(rows, "accuracy")) for c, rows in ordered(by).items()}


def _fig_validation(runs, labels, colors, x: str, name: str, xlabel: str):
    have = [(r, lab, c) for r, lab, c in zip(runs, labels, colors) if r.validation]
    if not have:
        return None
    fig, ax = _new_axes(FIGURES[name], xlabel, "held-out accuracy (greedy)")
    for r, lab, c in have:
        for cond, (xs, acc) in validation_series(r, x).items():
            marker, ls = CONDITION_STYLE.get(cond, ("d", "-."))
            ms = 10 if marker == "*" else 5
            ax.plot(xs, acc, color=c, marker=marker, markersize=ms, linestyle=ls if len(xs) > 1 else "none",
                    label=f"{lab}: {cond}")
    ax.set_ylim(-0.02, 1.02)
    return _finish(fig, ax)


def fig_val_generation(runs, labels, colors):
    """Held-out accuracy against generation (ES) or training step (GRPO), every condition."""
    return _fig_validation(runs, labels, colors, "step", "val_accuracy_generation",
                           "generation (ES) / training step (GRPO)")


def fig_val_wallclock(runs, labels, colors):
    """Held-out accuracy against wall-clock seconds since the run started (SFT included)."""
    return _fig_validation(runs, labels, colors, "wall_s", "val_accuracy_wallclock", "wall-clock time (s)")


def _interval(v) -> tuple[float, float] | None:
    """(low, high) of a stored ``[low, high]`` or ``{"low", "high"}`` with finite, ordered ends, else None."""
    lo, hi = (v.get("low"), v.get("high")) if isinstance(v, dict) else (v if isinstance(v, list) and len(v) == 2
                                                                          else (None, None))
    ok = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (lo, hi)) and lo <= hi
    return (float(lo), float(hi)) if ok else None


def _log2_k_axis(ax, ks) -> None:
    from matplotlib.ticker import NullFormatter, ScalarFormatter
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ks))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())


def _eval_name(run: RunData, label: str, d: Path, cond: str) -> str:
    return f"{label}: {cond}" if d == run.path else f"{label}/{d.name}: {cond}"


def _curve_colors(runs: list[RunData], curves: list[tuple]) -> list:
    """The run's colour (``curve[1]``) when several runs are overlaid; with one run, one colour per
    condition (``curve[2]``) in the order of its eval summaries, the same in passk.png and passk_diff.png."""
    if len(runs) > 1:
        return [c[1] for c in curves]
    conds = list(dict.fromkeys(cond for r in runs for _, s in r.evals for cond in s.get("conditions") or {}))
    palette = _colors(len(conds))
    return [palette[conds.index(c[2])] if c[2] in conds else c[1] for c in curves]


OTHER_MARKERS = ("d", "^", "v", "P", "X", "h", "<", ">")


def _eval_style(runs: list[RunData], cond: str) -> tuple[str, str]:
    """(marker, linestyle) of an eval condition: :data:`CONDITION_STYLE` for the known names, else a marker
    by the condition's place among the evals' other conditions (``-.``), so overlaid runs keep them apart."""
    if cond in CONDITION_STYLE:
        return CONDITION_STYLE[cond]
    others = list(dict.fromkeys(c for r in runs for _, s in r.evals for c in s.get("conditions") or {}
                                if c not in CONDITION_STYLE))
    return OTHER_MARKERS[others.index(cond) % len(OTHER_MARKERS)] if cond in others else "d", "-."


def _band(ax, pts: list[tuple[int, dict | list | None]], color) -> None:
    """Shade the intervals of ``pts`` ((k, interval) pairs) where every k has one."""
    spans = [_interval(v) for _, v in pts]
    if spans and all(spans):
        ax.fill_between([k for k, _ in pts], [lo for lo, _ in spans], [hi for _, hi in spans],
                        color=color, alpha=0.15, linewidth=0)


def fig_passk(runs, labels, colors):
    """pass@k against k (log2 axis) for every condition of every eval summary, with the bootstrap 95 %
    interval of each mean over problems shaded (``pass_at_k_ci95``, essa eval; absent in older summaries)."""
    curves = []
    for r, lab, c in zip(runs, labels, colors):
        for d, s in r.evals:
            for cond, res in s.get("conditions", {}).items():
                pk = {int(k): v for k, v in (res.get("pass_at_k") or {}).items() if v is not None}
                if pk:
                    ci = res.get("pass_at_k_ci95") or {}
                    curves.append((_eval_name(r, lab, d, cond), c, cond, sorted(pk.items()), s.get("n"),
                                   s.get("temperature"), [(k, ci.get(str(k))) for k in sorted(pk)]))
    if not curves:
        return None
    fig, ax = _new_axes(FIGURES["passk"], "k (samples per problem)", "pass@k")
    for (name, _, cond, pts, n, temp, ci), c in zip(curves, _curve_colors(runs, curves)):
        marker, ls = _eval_style(runs, cond)
        ks, vs = zip(*pts)
        ax.plot(ks, vs, color=c, marker=marker, linestyle=ls if cond != "best" else "--",
                label=f"{name} (n={n}, T={temp})")
        _band(ax, ci, c)
    _log2_k_axis(ax, {k for curve in curves for k, _ in curve[3]})
    ax.set_ylim(-0.02, 1.02)
    return _finish(fig, ax)


def fig_passk_diff(runs, labels, colors):
    """pass@k of each condition minus its eval's control against k (log2 axis), the paired bootstrap 95 %
    interval shaded, a zero line (``pass_at_k_vs_control``, essa eval n > 1). A condition beats the
    control at a k where the whole band lies above 0."""
    curves = []
    for r, lab, c in zip(runs, labels, colors):
        for d, s in r.evals:
            for cond, res in s.get("conditions", {}).items():
                table = res.get("pass_at_k_vs_control") or {}
                pts = sorted((int(k), v) for k, v in table.items()
                             if isinstance(v, dict) and isinstance(v.get("diff"), (int, float)))
                if pts:
                    curves.append((f"{_eval_name(r, lab, d, cond)} - {s.get('control')}", c, cond, pts,
                                   s.get("n"), s.get("temperature")))
    if not curves:
        return None
    fig, ax = _new_axes(FIGURES["passk_diff"], "k (samples per problem)", "pass@k difference against the control")
    for (name, _, cond, pts, n, temp), c in zip(curves, _curve_colors(runs, curves)):
        marker, ls = _eval_style(runs, cond)
        ax.plot([k for k, _ in pts], [v["diff"] for _, v in pts], color=c, marker=marker, linestyle=ls,
                label=f"{name} (n={n}, T={temp}, {pts[0][1].get('problems')} problems)")
        _band(ax, pts, c)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    _log2_k_axis(ax, {k for curve in curves for k, _ in curve[3]})
    return _finish(fig, ax)


def fig_paired_gain(runs, labels, colors):
    """One row per run and condition of summary.json's ``paired_vs_sft``: the accuracy difference
    against the SFT warm start on the same problems, with its 95 % interval and exact McNemar p
    (engine/results/stats.py). A run helps where its whole interval lies right of 0 (issue 11's test)."""
    def usable(st) -> bool:
        vals = [st.get(k) for k in ("diff", "ci_low", "ci_high")] if isinstance(st, dict) else [None]
        return (all(isinstance(v, (int, float)) and math.isfinite(v) for v in vals)
                and vals[1] <= vals[0] <= vals[2])

    def paired(r) -> dict:
        p = r.summary.get("paired_vs_sft")
        return p if isinstance(p, dict) else {}

    rows = [(lab, c, cond, st) for r, lab, c in zip(runs, labels, colors)
            for cond, st in paired(r).items() if usable(st)]
    if not rows:
        return None
    fig, ax = _new_axes(FIGURES["paired_gain"], "accuracy difference against the SFT warm start", "")
    for i, (lab, c, cond, st) in enumerate(rows):  # first row on top, legend in the same order
        marker = CONDITION_STYLE.get(cond, ("d", "-."))[0]
        p = st.get("p_value") if isinstance(st.get("p_value"), (int, float)) else None
        ax.errorbar([st["diff"]], [len(rows) - 1 - i], xerr=[[st["diff"] - st["ci_low"]], [st["ci_high"] - st["diff"]]],
                    fmt=marker, color=c, capsize=3, markersize=8 if marker == "*" else 5,
                    label=f"{lab}: {cond}" + (f" (p {p:.2g}, n {st.get('n')})" if p is not None else ""))
    ax.axvline(0.0, color="grey", linewidth=0.8)
    ax.set_yticks([])
    ax.set_ylim(-0.7, len(rows) - 0.3)
    return _finish(fig, ax)


def drift_points(run: RunData, label: str) -> list[tuple[float, float, str]]:
    """(off-task KL, on-task greedy accuracy, name) per condition of each eval with drift results: KL
    against the eval's first reference, token-weighted, averaged over its prompt sets other than the
    eval's own task (all of them when that is the only one)."""
    points = []
    for d, s in run.evals:
        drift = s.get("drift") or {}
        if not drift:
            continue
        per_set = next(iter(drift.values()))
        sets = [k for k in per_set if k != s.get("task")] or list(per_set)
        for cond, row in (s.get("conditions") or {}).items():
            kls = [per_set[k][cond]["kl_token"] for k in sets if cond in per_set[k]]
            if kls and row.get("greedy_accuracy") is not None:
                points.append((float(np.mean(kls)), float(row["greedy_accuracy"]), f"{label}: {cond}"))
    return points


def fig_drift(runs, labels, colors):
    """One point per evaluated adapter: on-task greedy accuracy against off-task KL(reference || adapter)
    (essa eval drift.enabled=true; engine/evaluation/drift.py)."""
    pts = [(p, c) for r, lab, c in zip(runs, labels, colors) for p in drift_points(r, lab)]
    if not pts:
        return None
    ref = next(iter(next(s for r in runs for _, s in r.evals if s.get("drift"))["drift"]))
    fig, ax = _new_axes(FIGURES["drift"], f"off-task KL({ref} || adapter), nats per token", "on-task accuracy (greedy)")
    for (x, y, name), c in pts:
        ax.plot([x], [y], marker="o", linestyle="none", color=c, label=name)
    return _finish(fig, ax)


FIGURE_BUILDERS: dict[str, Callable] = {
    "fitness": fig_fitness,
    "signal": fig_signal,
    "sigma": fig_sigma,
    "val_accuracy_generation": fig_val_generation,
    "val_accuracy_wallclock": fig_val_wallclock,
    "passk": fig_passk,
    "passk_diff": fig_passk_diff,
    "throughput": fig_throughput,
    "paired_gain": fig_paired_gain,
    "drift": fig_drift,
}


def build_figures(runs: list[RunData]) -> dict[str, object]:
    """Every figure the runs have data for: ``{file stem: matplotlib Figure}`` (not saved)."""
    labels, colors = _unique_labels(runs), _colors(len(runs))
    out = {}
    for name, builder in FIGURE_BUILDERS.items():
        fig = builder(runs, labels, colors)
        if fig is not None:
            out[name] = fig
    return out


# --- Markdown ---------------------------------------------------------------------------------

def _fmt(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "-"
    return f"{v + 0.0:.{digits}f}" if isinstance(v, float) else str(v)  # + 0.0: -0.0 prints 0.000


def final_accuracy(run: RunData) -> dict[str, tuple[float, int, int]]:
    """Latest held-out accuracy per condition: ``{condition: (accuracy, step, n_problems)}``."""
    latest: dict[str, tuple[float, int, int]] = {}
    for r in run.validation:
        latest[str(r["condition"])] = (r.get("accuracy"), r.get("step"), r.get("n_problems"))
    return ordered(latest)


def _link_target(path: str) -> str:
    """A Markdown link target for ``path``: in angle brackets when it holds a space (CommonMark), else as is."""
    return f"<{path}>" if " " in path else path


def write_markdown(runs: list[RunData], figures: dict[str, Path], skipped: dict[str, str], out_dir: Path,
                   preamble: list[str] | None = None) -> Path:
    """report.md: ``preamble`` (Markdown lines, e.g. a sweep table), runs, final accuracy per
    condition, eval results, figure links."""
    labels = _unique_labels(runs)
    rel = lambda p: _link_target(os.path.relpath(p, out_dir))  # noqa: E731
    lines = ["# Run report", "", *(preamble or []), "## Runs", "",
             "| run | method | task | generations (GRPO: steps) | wall time after the warm start (s) | directory |",
             "|---|---|---|---|---|---|"]
    for r, lab in zip(runs, labels):
        gens = len(r.metrics) if r.metrics else "-"
        wall = r.summary.get("wall_s") or max([x.get("wall_s") or 0.0 for x in r.metrics + r.validation], default=None)
        lines.append(f"| {lab} | {r.method or '-'} | {r.meta.get('task', '-')} | {gens} | {_fmt(wall, 1)} | "
                     f"[{r.path.name}]({rel(r.path)}) |")
    conds = []
    for r in runs:
        conds += [c for c in final_accuracy(r) if c not in conds]
    if conds:
        lines += ["", "## Held-out accuracy (greedy, latest evaluation of each condition)", "",
                  "| run | " + " | ".join(conds) + " | problems | last step |",
                  "|---|" + "---|" * (len(conds) + 2)]
        for r, lab in zip(runs, labels):
            fa = final_accuracy(r)
            if not fa:
                continue
            n = max((v[2] or 0) for v in fa.values())
            step = max((v[1] or 0) for v in fa.values())
            lines.append(f"| {lab} | " + " | ".join(_fmt(fa[c][0]) if c in fa else "-" for c in conds)
                         + f" | {n} | {step} |")
    evals = [(r, lab, d, s) for r, lab in zip(runs, labels) for d, s in r.evals]
    if evals:
        ks = sorted({int(k) for *_, s in evals for res in s.get("conditions", {}).values()
                     for k in (res.get("pass_at_k") or {})})
        lines += ["", "## Evaluation (essa eval)", "",
                  "| run | eval | task/split | condition | greedy | avg@n | " + " | ".join(f"pass@{k}" for k in ks)
                  + " | problems |", "|---|---|---|---|---|---|" + "---|" * (len(ks) + 1)]
        for r, lab, d, s in evals:
            for cond, res in s.get("conditions", {}).items():
                pk = res.get("pass_at_k") or {}
                lines.append(f"| {lab} | [{d.name}]({rel(d)}) | {s.get('task', '-')}/{s.get('split', '-')} | {cond} | "
                             f"{_fmt(res.get('greedy_accuracy'))} | {_fmt(res.get('avg_at_n'))} (n={s.get('n')}) | "
                             + " | ".join(_fmt(pk.get(str(k))) for k in ks) + f" | {res.get('n_problems')} |")
        lines += passk_diff_lines([(lab, d, s) for _, lab, d, s in evals], rel)
    lines += ["", "## Figures", ""]
    for name, path in figures.items():
        lines += [f"### {FIGURES[name]}", "", f"![{FIGURES[name]}]({rel(path)})", ""]
    if skipped:
        lines += ["Not drawn: " + "; ".join(f"`{k}.png` ({why})" for k, why in skipped.items()), ""]
    return io.atomic_write_bytes(out_dir / "report.md", "\n".join(lines).encode())


def _signed(x: float) -> str:
    return f"{round(x, 3) + 0.0:+.3f}"          # round, then + 0.0: a -1e-17 prints +0.000, not -0.000


def _diff_cell(v) -> str:
    ok = isinstance(v, dict) and isinstance(v.get("diff"), (int, float)) and _interval(v)
    return f"{_signed(v['diff'])} [{_signed(v['low'])}, {_signed(v['high'])}]" if ok else "-"


def passk_diff_lines(evals: list[tuple[str, Path, dict]], rel: Callable[[Path], str]) -> list[str]:
    """report.md's table of pass@k differences (essa eval's ``pass_at_k_vs_control`` and ``pass_at_k_pairs``):
    one row per comparison, ``diff [low, high]`` per k with the paired bootstrap 95 % interval over the
    problems both conditions score; [] when no eval has them.

    Args:
        evals: (run label, eval directory, eval_summary.json dict). rel: path -> link relative to report.md.
    """
    rows = []
    for lab, d, s in evals:
        comps = [(cond, s.get("control"), res.get("pass_at_k_vs_control"))
                 for cond, res in (s.get("conditions") or {}).items() if res.get("pass_at_k_vs_control")]
        comps += [(p.get("condition"), p.get("against"), p.get("pass_at_k")) for p in s.get("pass_at_k_pairs") or []
                  if isinstance(p, dict) and p.get("pass_at_k")]
        rows += [(lab, d, s, a, b, table) for a, b, table in comps if isinstance(table, dict)]
    if not rows:
        return []
    ks = sorted({int(k) for *_, table in rows for k in table})
    lines = ["", "### pass@k differences (paired bootstrap over problems, 95 % interval)", "",
             "| run | eval | T | n | condition | minus | " + " | ".join(f"pass@{k}" for k in ks) + " | problems |",
             "|---|---|---|---|---|---|" + "---|" * (len(ks) + 1)]
    for lab, d, s, a, b, table in rows:
        probs = next((v.get("problems") for v in table.values() if isinstance(v, dict)), "-")
        lines.append(f"| {lab} | [{d.name}]({rel(d)}) | {s.get('temperature', '-')} | {s.get('n', '-')} | {a} | {b} | "
                     + " | ".join(_diff_cell(table.get(str(k))) for k in ks) + f" | {probs} |")
    return lines


SKIP_REASONS = {
    "fitness": "no fitness_mean in metrics.parquet (an ES run's)", "signal": "no split_half_rho in metrics.parquet", "sigma": "no sigma in metrics.parquet",
    "val_accuracy_generation": "no validation.parquet", "val_accuracy_wallclock": "no validation.parquet",
    "passk": "no eval_summary.json with n > 1",
    "passk_diff": "no eval_summary.json with pass_at_k_vs_control (essa eval n > 1 with two or more conditions)",
    "throughput": "no tokens_per_s in metrics.parquet",
    "paired_gain": "no summary.json with paired_vs_sft (a finished run with eval.baselines)",
    "drift": "no eval_summary.json with drift results (essa eval drift.enabled=true)",
}


def _draw(name: str, builder: Callable, runs, labels, colors, out_dir: Path) -> Path | None:
    """Build one figure and save it atomically as ``out_dir/<name>.png``; None when the runs have no data for it."""
    fig = builder(runs, labels, colors)
    if fig is None:
        return None
    path = out_dir / f"{name}.png"
    with io.atomic_file(path) as tmp:
        fig.savefig(tmp, format="png")
    return path


class FigureError(RuntimeError):
    """Some figures of a report failed (their errors are in report.md and the log); the others and
    report.md were written. ``paths``: what was written; ``failed``: figure name -> error line."""

    def __init__(self, paths: list[Path], failed: dict[str, str]):
        self.paths, self.failed = paths, failed
        super().__init__("; ".join(f"{k}.png: {why}" for k, why in failed.items()))


def make_report(run_dirs: list[Path], out_dir: Path, *, runs: list[RunData] | None = None,
                preamble: list[str] | None = None, strict: bool = False) -> list[Path]:
    """Render the figures and report.md of one or more run directories into ``out_dir``.

    Args:
        run_dirs: run directories (train, grpo or eval output).
        out_dir: destination (created).
        runs: the runs already loaded (then ``run_dirs`` is not read).
        preamble: Markdown lines put at the top of report.md.
        strict: raise :class:`FigureError` (after writing everything else) when a figure failed;
            otherwise a failed figure is a warning and a "Not drawn" line in report.md.

    Returns:
        Paths written: the PNG figures, then report.md.

    Raises:
        ValueError: a path is not a run directory or holds a corrupt run file, or ``out_dir`` cannot
            be created (one-line messages).
        FigureError: ``strict`` and a figure's builder raised.
    """
    runs = [load_run(p) for p in run_dirs] if runs is None else runs
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {out_dir}: cannot create the report directory ({e.strerror or e}); "
                         f"pass a writable directory with --out") from None
    if not os.access(out_dir, os.W_OK):
        raise ValueError(f"--out {out_dir}: the report directory is not writable; pass a writable directory with --out")
    labels, colors = _unique_labels(runs), _colors(len(runs))
    written: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    for name, builder in FIGURE_BUILDERS.items():
        try:
            path = _draw(name, builder, runs, labels, colors, out_dir)
        except Exception as e:  # noqa: BLE001 - one bad figure must not lose the others
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log.warning("report: %s.png failed (%s)", name, why)
            skipped[name] = f"error: {why}"
            continue
        if path is None:
            skipped[name] = SKIP_REASONS[name]
        else:
            written[name] = path
    md = write_markdown(runs, written, skipped, out_dir, preamble)
    log.info("report: %d figures and %s", len(written), md)
    failed = {k: why for k, why in skipped.items() if why.startswith("error: ")}
    if strict and failed:
        raise FigureError([*written.values(), md], failed)
    return [*written.values(), md]


# --- sweeps (essa train -m ...) ------------------------------------------------------------------

@dataclass
class SweepJob:
    """One job of a Hydra sweep directory.

    Attributes:
        number: the job's directory name (its Hydra job number).
        path: the job directory.
        overrides: its task overrides (``.hydra/overrides.yaml``).
        status: ``done`` (summary.json), ``failed`` (error.txt) or ``incomplete`` (running, killed).
        accuracy: held-out accuracy of the final mean genome (``summary.json`` ``val.mean``), or NaN.
        ci: (low, high) 95 % interval of that accuracy when summary.json has one (``val_ci95``), or None.
        wall_s: run clock in seconds (summary.json, else the last logged ``wall_s``), or NaN.
        error: the one-line error of a failed job ("" otherwise).
    """

    number: str
    path: Path
    overrides: list[str]
    status: str
    accuracy: float = float("nan")
    ci: tuple[float, float] | None = None
    wall_s: float = float("nan")
    error: str = ""


def is_sweep_dir(path: str | Path) -> bool:
    """True for a Hydra multirun directory: not itself a run directory, with job directories
    (sub-directories holding ``.hydra/``)."""
    from engine.results.sweeps import job_dirs

    path = Path(path)
    return path.is_dir() and not any((path / f).is_file() for f in RUN_FILES) and bool(job_dirs(path))


def _as_float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def load_sweep(sweep_dir: str | Path) -> list[SweepJob]:
    """Every job of a sweep directory, best first: finished jobs by accuracy (NaN last), then
    incomplete, then failed jobs, each by job number.

    Raises:
        ValueError: ``sweep_dir`` has no job directories, or a job's summary.json is corrupt (the
            message names the file).
    """
    from engine.results.sweeps import ERROR_FILE, job_dirs, job_overrides

    jobs = []
    for d in job_dirs(sweep_dir):
        job = SweepJob(d.name, d, job_overrides(d), "incomplete")
        if (d / ERROR_FILE).is_file():
            job.status = "failed"
            job.error = (d / ERROR_FILE).read_text(encoding="utf-8", errors="replace").strip().split("\n")[0]
        elif (d / "summary.json").is_file():
            summary = _read_json(d / "summary.json")
            job.status = "done"
            job.accuracy = _as_float((summary.get("val") or {}).get("mean"))
            ci = (summary.get("val_ci95") or summary.get("val_ci") or {}).get("mean")
            if isinstance(ci, (list, tuple)) and len(ci) == 2:
                job.ci = (_as_float(ci[0]), _as_float(ci[1]))
            job.wall_s = _as_float(summary.get("wall_s"))
        if not np.isfinite(job.wall_s):
            walls = [_as_float(r.get("wall_s")) for r in _read_parquet(d / "metrics.parquet")]
            job.wall_s = max([w for w in walls if np.isfinite(w)], default=float("nan"))
        jobs.append(job)
    if not jobs:
        raise ValueError(f"{sweep_dir} is not a sweep directory (no job directories with .hydra/); "
                         f"pass multirun/<time> of an essa train -m run")
    rank = {"done": 0, "incomplete": 1, "failed": 2}
    return sorted(jobs, key=lambda j: (rank[j.status], -j.accuracy if np.isfinite(j.accuracy) else np.inf))


def sweep_table(jobs: list[SweepJob]) -> list[str]:
    """Markdown table of a sweep: job, overrides, status, final accuracy (with its 95 % interval
    when known), wall time; one row per job in the given order."""
    lines = ["| job | overrides | status | final accuracy (mean genome) | wall time (s) |", "|---|---|---|---|---|"]
    for j in jobs:
        acc = _fmt(j.accuracy)
        if j.ci is not None and acc != "-":
            acc += f" [{_fmt(j.ci[0])}, {_fmt(j.ci[1])}]"
        status = f"failed: {j.error}" if j.status == "failed" else j.status
        lines.append(f"| {j.number} | {' '.join(j.overrides) or '-'} | {status.replace('|', '/')} | {acc} | "
                     f"{_fmt(j.wall_s, 1)} |")
    return lines


def make_sweep_report(sweep_dir: str | Path, out_dir: str | Path, strict: bool = False) -> list[Path]:
    """report.md of a sweep (the :func:`sweep_table`, best first, then the usual run sections) and
    the figures of every job that logged anything, overlaid (legend: job number and overrides).

    Returns:
        Paths written: the PNG figures, then report.md.

    Raises:
        ValueError: as :func:`load_sweep` and :func:`make_report`.
        FigureError: as :func:`make_report` (``strict``).
    """
    jobs = load_sweep(sweep_dir)
    runs = []
    for j in sorted(jobs, key=lambda j: (0, int(j.number)) if j.number.isdigit() else (1, j.number)):
        if any((j.path / f).is_file() for f in RUN_FILES):
            run = load_run(j.path)
            run.label = f"job {j.number}: {' '.join(j.overrides) or 'defaults'}"
            runs.append(run)
    pre = [f"## Sweep {Path(sweep_dir)} ({len(jobs)} jobs, best first)", "", *sweep_table(jobs), ""]
    return make_report([], Path(out_dir), runs=runs, preamble=pre, strict=strict)


def cli(argv: list[str] | None = None) -> None:
    """``essa report RUN_DIR [RUN_DIR ...] [--out DIR]``: prints the paths written; exits 2 with one line
    on a bad path, 1 with one line when a figure failed (the others and report.md are written). Returns None (the console script passes main's return value to ``sys.exit``)."""
    parser = argparse.ArgumentParser(prog="essa report", description="PNG figures + report.md of run directories "
                                     "(several runs are overlaid on one axis), or of one sweep directory "
                                     "(multirun/<time>: a table of all jobs, best first).")
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (essa train / grpo / eval)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: <run dir>/report for one run, "
                             "outputs/reports/<time> for several)")
    args = parser.parse_args(argv)
    for d in args.run_dirs:
        if not d.exists():
            print(f"essa: error: {d} does not exist; pass a run directory written by essa train, essa grpo or "
                  f"essa eval (outputs/...) or a sweep directory (multirun/<time>)", file=sys.stderr)
            sys.exit(2)
    sweep = len(args.run_dirs) == 1 and is_sweep_dir(args.run_dirs[0])  # essa report multirun/<time>
    out = args.out or (args.run_dirs[0] / "report" if len(args.run_dirs) == 1
                       else Path("outputs") / "reports" / time.strftime("%Y-%m-%d_%H-%M-%S"))
    try:
        if sweep:
            print("\n".join(sweep_table(load_sweep(args.run_dirs[0]))))
            paths = make_sweep_report(args.run_dirs[0], out, strict=True)
        else:
            paths = make_report(args.run_dirs, out, strict=True)
    except (ValueError, FileNotFoundError) as e:
        print(f"essa: error: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    except FigureError as e:
        print("\n".join(map(str, e.paths)))
        print(f"essa: error: {len(e.failed)} figure(s) failed, the rest were written: {e}", file=sys.stderr)
        sys.exit(1)
    for p in paths:
        print(p)
