"""The files of a run directory that ``essa train`` and ``essa grpo`` share, written in one place.

* ``run.json``: what ran (:func:`run_metadata`; the label by :func:`run_label`);
* ``validation.parquet`` (accuracy per step and condition) and ``validation_problems.parquet`` (the
  reward of every held-out problem: the paired data of the final test): :class:`ValidationLog`;
* ``summary.json`` and the final table: :func:`final_summary`.

Every file is written atomically (engine/io.py); docs/ARCHITECTURE.md lists the columns. With a
``tracker`` (engine/results/trackers.py) the metrics rows, validations and summary also go to it;
the files stay the record.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from engine import io
from engine.results.stats import (VALIDATION_PROBLEMS, format_summary, latest_per_problem, ordered,
                                  summarise_conditions)

log = logging.getLogger("essa")

VALIDATION = "validation.parquet"

RUN_CONTROL_OVERRIDES = ("hydra", "resume=", "deadline_s=", "report=", "label=", "oracle_genome=")
"""Overrides that steer a run's execution, not what it trains: left out of its label."""


def hydra_overrides() -> list[str]:
    """The command line's overrides of the running Hydra job (``[]`` outside Hydra, e.g. in tests)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        return list(HydraConfig.get().overrides.task)
    except Exception:  # noqa: BLE001 - not under Hydra
        return []


def run_label(method: str, label: str | None, overrides: list[str]) -> str:
    """A run's name in reports: ``label`` when set, else the method and the Hydra overrides that shape
    the training (``essa train seed=1 strategy.genome.alpha=1`` -> ``"essa seed=1
    strategy.genome.alpha=1"``), without the run-control ones (:data:`RUN_CONTROL_OVERRIDES`)."""
    return label or " ".join([method] + [o for o in overrides if not o.lstrip("+~").startswith(RUN_CONTROL_OVERRIDES)])


def run_metadata(method: str, label: str | None, model: str, model_path: str, task: str, seed: int,
                 sft_adapter, config: dict, **fields) -> dict:
    """The ``run.json`` dict: method (essa, grpo, f-grpo, ...), label, the Hydra overrides, model (as
    configured and resolved), task, seed, the SFT adapter's directory, ``fields`` (per method), and the
    whole resolved ``config`` (a plain dict)."""
    overrides = hydra_overrides()
    return {"method": method, "label": run_label(method, label, overrides), "overrides": overrides,
            "model": model, "model_path": model_path, "task": task, "seed": seed, **fields,
            "sft_adapter": str(sft_adapter), "config": config}


class MetricsLog:
    """``metrics.parquet`` of one run: one row per generation (essa train) or optimiser step (essa grpo),
    rows kept in memory and the file rewritten atomically after each.

    Args:
        run_dir: the run directory (rows already there are read, so a resumed run appends).
        tracker: an experiment tracker every row also goes to, at its ``generation`` (or ``step``).
    """

    def __init__(self, run_dir: str | Path, tracker=None):
        self.path = Path(run_dir) / "metrics.parquet"
        self.rows = io.read_rows(self.path)
        self.tracker = tracker

    def add(self, row: dict) -> None:
        """Append one row, rewrite the file, then send the row to the tracker."""
        self.rows.append(row)
        io.write_parquet(self.path, self.rows)
        if self.tracker is not None:
            self.tracker.log_metrics(row, int(row.get("generation", row.get("step", len(self.rows) - 1))))


class ValidationLog:
    """``validation.parquet`` and ``validation_problems.parquet`` of one run, rows kept in memory.

    Args:
        run_dir: the run directory (rows already there are read, so a resumed run appends).
        method: the ``method`` column (essa, grpo, f-grpo).
        problems: the held-out problems, in the order every ``add`` gives their rewards.
        clock: seconds on the run clock (the ``wall_s`` column).
        tracker: an experiment tracker every validation's accuracies also go to.
    """

    def __init__(self, run_dir: str | Path, method: str, problems: Sequence, clock: Callable[[], float],
                 tracker=None):
        self.run_dir, self.method, self.problems, self.clock = Path(run_dir), method, problems, clock
        self.tracker = tracker
        self.rows = io.read_rows(self.run_dir / VALIDATION)
        self.problem_rows = io.read_rows(self.run_dir / VALIDATION_PROBLEMS)

    def has_step(self, step: int) -> bool:
        """Whether a validation at ``step`` is already logged."""
        return any(r["step"] == step for r in self.rows)

    def add(self, step: int, per_problem: dict[str, np.ndarray]) -> None:
        """Log one validation: ``{condition: (n,) float64 rewards}`` in ``problems`` order (NaN =
        unscorable, counted wrong); one row per condition and one per (condition, problem). A
        (step, condition) already logged is replaced (a resumed run redoing an interrupted final call)."""
        wall = self.clock()
        again = {(step, c) for c in per_problem}
        self.rows = [r for r in self.rows if (r["step"], r["condition"]) not in again]
        self.problem_rows = [r for r in self.problem_rows if (r["step"], r["condition"]) not in again]
        for cond, rewards in per_problem.items():
            acc = float(np.nan_to_num(np.asarray(rewards, dtype=float)).mean()) if len(rewards) else float("nan")
            self.rows.append({"step": step, "wall_s": wall, "condition": cond, "accuracy": acc,
                              "n_problems": len(self.problems), "method": self.method})
            self.problem_rows.extend({"step": step, "condition": cond, "problem_id": p.id, "reward": float(x)}
                                     for p, x in zip(self.problems, rewards))
            log.info("validation step %d: %s accuracy %.3f (%d problems, run clock %.1f s)", step, cond, acc,
                     len(self.problems), wall)
        io.write_parquet(self.run_dir / VALIDATION, self.rows)
        io.write_parquet(self.run_dir / VALIDATION_PROBLEMS, self.problem_rows)
        if self.tracker is not None and per_problem:
            self.tracker.log_validation(step, {r["condition"]: r["accuracy"] for r in self.rows[-len(per_problem):]})

    def summary(self) -> dict:
        """Accuracy, Wilson intervals and the paired test against the SFT warm start of every condition
        at its latest step (engine/results/stats.py ``summarise_conditions``)."""
        return summarise_conditions(ordered(latest_per_problem(self.problem_rows)))


def final_summary(run_dir: str | Path, stats: dict, task: str, control_note: str, /, *, tracker=None,
                  **fields) -> dict:
    """Print the final table and write ``summary.json``: ``val`` (accuracy per condition), ``val_ci95``,
    ``paired_vs_sft``, ``n_problems``, ``task`` and ``fields``; the dict also goes to ``tracker`` when
    given. Returns the dict written."""
    print(format_summary(stats, task, control_note=control_note, method=fields.get("method")))
    summary = {"val": stats["accuracy"], "val_ci95": stats["ci"], "paired_vs_sft": stats["paired"],
               "n_problems": stats["n_problems"], "task": task, **fields}
    io.write_json(Path(run_dir) / "summary.json", summary)
    if tracker is not None:
        tracker.log_summary(summary)
    return summary


def truncate_run_logs(run_dir: str | Path, generation: int) -> None:
    """Drop what an ``essa train`` run logged after its checkpointed ``generation`` (a crash between a
    log and the checkpoint): metrics rows, validations after step ``generation + 1``, rollout files."""
    run_dir = Path(run_dir)
    keep = {"metrics.parquet": lambda r: r["generation"] <= generation,
            VALIDATION: lambda r: r["step"] <= generation + 1,
            VALIDATION_PROBLEMS: lambda r: r["step"] <= generation + 1}
    for name, kept in keep.items():
        rows = [r for r in io.read_rows(run_dir / name) if kept(r)]
        if rows:
            io.write_parquet(run_dir / name, rows)
    for f in (run_dir / "rollouts").glob("gen_*.parquet"):
        if int(f.stem.split("_")[1]) > generation:
            f.unlink()


def clock_from(t0: float) -> Callable[[], float]:
    """A run clock: seconds since ``t0`` (a ``time.perf_counter()`` value)."""
    return lambda: time.perf_counter() - t0
