"""Running one Hydra command: compose, check, run the job, report failures in one line.

A single run that fails on bad configuration or input exits 2 with one line. In a multirun (``-m``)
every failure is caught instead: its line goes to ``<job dir>/error.txt`` and the job's log, the job
returns None (Optuna records a failed trial), and the sweep goes on (engine/results/sweeps.py); at
the end every failed job is named and the exit status is 1.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import sys
from pathlib import Path

from engine import io
from engine.commands import COMMANDS
from engine.config import CONF_DIR

USER_ERRORS = (ValueError, FileNotFoundError, KeyError, io.NoSpaceError)
"""Exceptions that mean bad configuration or input: one line, exit status 2, no traceback."""


def fail(e: BaseException) -> None:
    """Print ``essa: error: <first line of e>`` on stderr and exit with status 2."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"essa: error: {msg}", file=sys.stderr)
    sys.exit(2)


def _sweep_value(value) -> float | None:
    """A job's return value as Hydra sweepers take it: a finite float, else None (Optuna 2.10 crashes on
    NaN; None makes a failed trial)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def run_job(command: str, cfg) -> float | None:
    """Hydra's task function: run one job of ``command`` (``Command.runner()(cfg, run_dir)``).

    Returns:
        The command's value for sweepers (``essa train``: held-out accuracy of the final mean genome,
        ``essa grpo``: of the final policy, a fraction in [0, 1]), or None. Under the Optuna sweeper a
        job that returns None is recorded as failed (:data:`engine.results.sweeps.NO_VALUE_LINE`).
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from engine import interrupts
    from engine.results.sweeps import (NO_VALUE_LINE, clear_job_failure, counts_none_as_failure, error_line,
                                       record_job_failure)

    hc = HydraConfig.get()
    run_dir = hc.runtime.output_dir
    multirun = hc.mode == RunMode.MULTIRUN
    if multirun:
        clear_job_failure(run_dir)
    try:
        value = _sweep_value(COMMANDS[command].runner()(cfg, run_dir))
    except KeyboardInterrupt:
        sys.exit(interrupts.exit_status())
    except Exception as e:
        if interrupts.requested():  # e.g. vLLM's EngineDeadError: the Ctrl-C also reached the engine's process
            print(f"essa: interrupted ({type(e).__name__} after Ctrl-C)", file=sys.stderr)
            sys.exit(interrupts.exit_status())
        user_error = isinstance(e, USER_ERRORS)
        if os.environ.get("ESSA_DEBUG"):
            raise
        if multirun:
            if not user_error:
                logging.getLogger("essa").exception("job failed")  # the traceback, into the job's log
            record_job_failure(run_dir, error_line(e, user_error))
            return None
        if user_error:
            remove_refused_run_dir(run_dir, f"{hc.job.name}.log")
            fail(e)
        raise
    if value is None and multirun and counts_none_as_failure(hc.sweeper):  # a failed trial for Optuna
        record_job_failure(run_dir, NO_VALUE_LINE)
    return value


def remove_refused_run_dir(run_dir: str | Path, job_log: str) -> bool:
    """Remove the run directory Hydra made for a run that was refused before writing anything.

    Only a directory holding nothing but Hydra's ``.hydra/`` (config.yaml, hydra.yaml,
    overrides.yaml) and the job's log ``job_log`` is removed, so a refused run leaves no empty run
    behind for ``essa report`` or ``resume`` to trip on; anything else in it (a run's run.json,
    checkpoints, adapters, a user's own files) keeps the directory. Returns whether it was removed.
    """
    d = Path(run_dir)
    try:
        entries = {p.name for p in d.iterdir()}
        hydra_files = {p.name for p in (d / ".hydra").iterdir()} if (d / ".hydra").is_dir() else None
    except OSError:
        return False
    if hydra_files is None or not hydra_files <= {"config.yaml", "hydra.yaml", "overrides.yaml"}:
        return False
    if not entries <= {".hydra", job_log} or not (d / job_log).is_file() and job_log in entries:
        return False
    shutil.rmtree(d, ignore_errors=True)
    return not d.exists()


def run_hydra(command: str, argv: list[str]) -> None:
    """Register the schemas, check ``argv`` (one line on a bad override), then run ``command`` under
    Hydra (single run or ``-m`` sweep) with Ctrl-C handling; a sweep with failed jobs exits 1.
    ``-sc``/``--shell-completion`` goes to Hydra as the app ``essa`` (engine/cli/completion.py)."""
    import hydra

    from engine import interrupts
    from engine.results.sweeps import FINISHED_SWEEPS, failure_lines

    from .completion import completion_argv0
    from .overrides import precheck
    from .preview import preview, previewing

    register()

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=COMMANDS[command].yaml)
    def entry(cfg):
        return run_job(command, cfg)

    # essa's own log lines until Hydra runs (the preview's strategy line); then Hydra's logging alone,
    # or --info would print every line twice
    root, handler = logging.getLogger(), logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(asctime)s %(name)s] %(message)s", "%H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(min(root.level or logging.INFO, logging.INFO))
    try:
        cfg = precheck(command, argv, entry)
        if previewing(argv):  # --cfg job: refuse what the run would refuse, before Hydra prints the config
            preview(command, argv, cfg)
    except USER_ERRORS as e:
        fail(e)
    finally:
        root.removeHandler(handler)
    argv0, sys.argv = sys.argv, [completion_argv0(argv) or f"essa {command}"] + argv
    FINISHED_SWEEPS.clear()
    # Ctrl-C / kill -INT stops the run with a resume hint, even where SIGINT was inherited ignored
    # (a background job of a shell without job control) or also reached vLLM's engine process
    try:
        with interrupts.handling():
            entry()
    finally:
        sys.argv = argv0
    for sweep_dir in FINISHED_SWEEPS:  # multirun: name every failed job, then exit non-zero
        lines = failure_lines(sweep_dir)
        if lines:
            print("essa: error: " + "\n".join(lines), file=sys.stderr)
            sys.exit(1)


def register() -> None:
    """Everything essa's conf/ needs in Hydra's ConfigStore and OmegaConf's resolvers: the commands'
    schemas, the Optuna sweeper's maximising default (a plain ``@hydra.main`` app on conf/ registers these
    two, tests/test_hydra_conformance.py), the ``essa_groups`` resolver of ``--help`` (engine/cli/help.py)."""
    from engine.commands import register_configs
    from engine.results.sweeps import register_sweeper_defaults

    from .help import register_help_resolver

    register_configs()
    register_sweeper_defaults()  # hydra/sweeper=optuna maximises the returned accuracy
    register_help_resolver()
