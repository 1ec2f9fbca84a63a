"""Hydra multirun (``essa train -m ...``): per-job failure records and the end-of-sweep verdict.

Hydra's launchers (basic, Ray, submitit) record a job whose task function raises and go on with
the others, but Hydra then stops the sweep at the first failed job it reads back and prints a
traceback. essa keeps every job running and reports all failures at the end instead:

1. the task function (engine/cli/hydra_app.py) catches a job's error, writes its one line to
   ``<job dir>/error.txt`` (:data:`ERROR_FILE`), logs it, and returns None (Optuna marks the trial
   failed; not NaN, on which hydra-optuna-sweeper 1.3 with optuna 2.10 crashes);
2. :class:`SweepSummary`, a Hydra callback (``hydra.callbacks`` in conf/train.yaml), reads the
   sweep directory in the driver process when the sweep ends, so it also sees jobs that ran in Ray
   workers or SLURM jobs (on a shared file system);
3. the CLI exits 1 with one line per failed job (:func:`failure_lines`).

With the Optuna sweeper (``hydra/sweeper=optuna``), a job that returns no value (``essa train
generations=0``: no final validation) is a failed trial for Optuna, so essa records it as a failed job
too (:data:`NO_VALUE_LINE`); when no trial completed, Optuna's ``ValueError: No trials are completed
yet.`` traceback becomes that list of failed jobs (:func:`tolerate_no_completed_trial`); and the
sweeper maximises by default (:func:`register_sweeper_defaults`: every essa command returns a held-out
accuracy, while the plugin's default direction is minimize).

Job directories are ``<sweep dir>/<job number>`` (``hydra.sweep.subdir``: no ``=`` or ``,``, so
``resume=multirun/<time>/0`` needs no quoting); each job's overrides stay in
``<job dir>/.hydra/overrides.yaml``.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from engine import io

log = logging.getLogger("essa")

ERROR_FILE = "error.txt"

# Sweep directories finished in this process (set by SweepSummary in the Hydra driver process).
FINISHED_SWEEPS: list[Path] = []
# Optuna sweeps of this process in which no trial completed (no best trial, no optimization_results.yaml).
NO_BEST_TRIAL: set[Path] = set()

NO_VALUE_LINE = ("returned no held-out accuracy (the run ended without a final validation, e.g. generations=0), "
                 "which Optuna counts as a failed trial")


def counts_none_as_failure(sweeper_cfg) -> bool:
    """Whether the sweeper configured as ``hydra.sweeper`` treats a job that returns None as a failed
    trial (Optuna); the basic and other sweepers ignore return values."""
    try:
        target = sweeper_cfg.get("_target_", "")
    except Exception:  # noqa: BLE001 - not a config node
        target = ""
    return "optuna" in str(target).lower()


def register_sweeper_defaults() -> None:
    """Make ``hydra/sweeper=optuna`` maximise: store hydra-optuna-sweeper's ConfigStore node
    ``hydra/sweeper/optuna`` again with ``direction: maximize`` (a subclass of its schema; every other
    field, the sampler default included, stays the plugin's). A no-op without the plugin.

    A YAML file of the same name in conf/ cannot do it: Hydra matches it against the plugin's schema
    of that name, whose defaults list makes the composition fail."""
    import dataclasses

    try:
        from hydra_plugins.hydra_optuna_sweeper import config as optuna_conf
    except ImportError:
        return
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    Plugins.instance()  # Hydra's one plugin scan re-runs the plugin's own store(): ours must come after it

    maximize = dataclasses.make_dataclass(
        "EssaOptunaSweeperConf", [("direction", Any, dataclasses.field(default=optuna_conf.Direction.maximize))],
        bases=(optuna_conf.OptunaSweeperConf,))
    ConfigStore.instance().store(group="hydra/sweeper", name="optuna", node=maximize, provider="optuna_sweeper")


def tolerate_no_completed_trial() -> None:
    """Let an Optuna sweep in which no trial completed end like any sweep with failed jobs.

    hydra-optuna-sweeper 1.3 asks the study for its best trial after the last batch, and Optuna raises
    ``ValueError: No trials are completed yet.``: a traceback, no optimization_results.yaml, no job
    named, and Hydra skips the end-of-sweep callback. Wrapped here (once per process), that error is
    logged in one line and the sweep returns, so :class:`SweepSummary` and the CLI name every failed job.
    """
    from hydra_plugins.hydra_optuna_sweeper import _impl

    sweep = _impl.OptunaSweeperImpl.sweep
    if getattr(sweep, "_essa_tolerant", False):
        return

    def tolerant_sweep(self, arguments):
        try:
            return sweep(self, arguments)
        except ValueError as e:
            if "No trials are completed yet" not in str(e):
                raise
            sweep_dir = Path(str(self.config.hydra.sweep.dir))
            NO_BEST_TRIAL.add(sweep_dir)
            log.error("Optuna: no trial completed in %s, so there is no best trial (no optimization_results.yaml)",
                      sweep_dir)
            return None

    tolerant_sweep._essa_tolerant = True
    _impl.OptunaSweeperImpl.sweep = tolerant_sweep


def error_line(exc: BaseException, user_error: bool) -> str:
    """One line for a job's error: the message of a user error (bad config or input, which already
    names the field and the fix), ``Type: message`` for anything else."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if user_error and first:
        return first
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def record_job_failure(job_dir: str | Path, line: str) -> Path:
    """Write ``line`` to ``<job_dir>/error.txt`` (atomically) and log it.

    Args:
        job_dir: the job's Hydra output directory.
        line: one-line error (:func:`error_line`).

    Returns:
        The error file's path.
    """
    path = io.atomic_write_bytes(Path(job_dir) / ERROR_FILE, (line + "\n").encode())
    log.error("job failed: %s (recorded in %s)", line, path)
    return path


def clear_job_failure(job_dir: str | Path) -> None:
    """Remove a stale ``error.txt`` of an earlier attempt in the same job directory."""
    (Path(job_dir) / ERROR_FILE).unlink(missing_ok=True)


def job_dirs(sweep_dir: str | Path) -> list[Path]:
    """The job directories of a sweep (sub-directories holding ``.hydra/``), by job number."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return []
    jobs = [p for p in sweep_dir.iterdir() if p.is_dir() and (p / ".hydra").is_dir()]

    def key(p: Path):
        head = p.name.split("_", 1)[0]
        return (0, int(head), p.name) if head.isdigit() else (1, 0, p.name)

    return sorted(jobs, key=key)


def job_overrides(job_dir: str | Path) -> list[str]:
    """The task overrides of a job (``.hydra/overrides.yaml``; [] when absent or unreadable)."""
    path = Path(job_dir) / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    try:
        from omegaconf import OmegaConf
        return [str(o) for o in OmegaConf.to_container(OmegaConf.load(path))]
    except Exception:  # noqa: BLE001 - a damaged file must not hide the other jobs
        return []


def failed_jobs(sweep_dir: str | Path) -> list[tuple[Path, str]]:
    """``(job dir, error line)`` of every job of the sweep that recorded a failure."""
    out = []
    for job in job_dirs(sweep_dir):
        err = job / ERROR_FILE
        if err.is_file():
            lines = err.read_text(encoding="utf-8", errors="replace").strip().splitlines()
            out.append((job, lines[0] if lines else "failed"))
    return out


def failure_lines(sweep_dir: str | Path) -> list[str]:
    """The CLI's end-of-sweep message: [] when no job failed, else a headline and one line per
    failed job (number, overrides, error)."""
    failed = failed_jobs(sweep_dir)
    if not failed:
        return []
    total = len(job_dirs(sweep_dir))
    names = ", ".join(job.name for job, _ in failed)
    why = "; no trial completed, so Optuna has no best trial" if Path(sweep_dir) in NO_BEST_TRIAL else ""
    lines = [f"{len(failed)} of {total} sweep jobs failed (job {names}) in {sweep_dir}{why} (each job's error is in "
             f"<job dir>/{ERROR_FILE}):"]
    for job, line in failed:
        lines.append(f"  job {job.name} ({' '.join(job_overrides(job)) or 'no overrides'}): {line}")
    return lines


class SweepSummary(Callback):
    """Hydra callback: remembers the sweep directory when a multirun ends (driver process), so the
    CLI can name the failed jobs after Hydra returns; before an Optuna sweep starts, makes a sweep
    without a completed trial end that way too (:func:`tolerate_no_completed_trial`)."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        if counts_none_as_failure(config.hydra.sweeper):
            tolerate_no_completed_trial()

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        FINISHED_SWEEPS.append(sweep_dir)
        failed = failed_jobs(sweep_dir)
        log.info("sweep %s: %d jobs, %d failed", sweep_dir, len(job_dirs(sweep_dir)), len(failed))
