"""Experiment trackers: a run's metrics, validations, summary, figures and config, also sent to TensorBoard,
MLflow or Weights & Biases (``logger=none|tensorboard|mlflow|wandb``, conf/logger/).

The run directory's Parquet and JSON files stay the record; a tracker is a view. So a tracker never stops
or corrupts a run: :func:`make_tracker` wraps it in :class:`SafeTracker`, which catches the first exception
of any call, logs ONE warning line, closes it and ignores every later call (a Ctrl-C still stops the run).

* ``tensorboard``: torch's ``SummaryWriter`` (TensorBoard's event format) into ``<run>/tensorboard``;
  read back with TensorBoard's ``EventAccumulator`` or ``tensorboard --logdir``.
* ``mlflow``: an ``MlflowClient`` run in ``logger.tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else the
  local file store ``file:<run>/mlruns`` (``mlflow ui --backend-store-uri <run>/mlruns``).
* ``wandb``: a W&B run in ``<run>/wandb``; offline (``wandb sync`` uploads it later) unless an API key is
  configured and api.wandb.ai answers, ``$WANDB_MODE`` or ``logger.offline`` decide otherwise; one log
  line says which and why.

How the run ended goes to every tracker's close (:func:`end_status`): MLflow's run status (``FINISHED``,
``FAILED`` on an error, ``KILLED`` on Ctrl-C or SIGTERM), W&B's exit code (0, 1, 130 / 143: a nonzero code
marks the run failed), TensorBoard (which has no run status) a text entry ``status``.

Series names: the metrics.parquet columns (``fitness_mean``, ``sigma``, ...; essa grpo's ``reward_mean``,
``loss``, ...) at the generation (optimiser step) of their row, ``val/<condition>`` (held-out accuracy) at
the validation's step, ``summary/<key>`` once at the end; NaN and non-numeric values are left out.
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
from pathlib import Path

log = logging.getLogger("essa")

STATUSES = ("FINISHED", "FAILED", "KILLED")
"""How a run ended, in MLflow's words (``mlflow.entities.RunStatus``)."""

STEP_KEYS = ("generation", "step")
"""The metrics.parquet column that is a row's step (essa train: generation, essa grpo: step)."""


def scalars(row: dict, skip: tuple[str, ...] = ()) -> dict[str, float]:
    """The finite numbers of ``row`` as floats (bools as 0/1), without the keys in ``skip``."""
    out = {}
    for k, v in row.items():
        if k in skip or isinstance(v, str) or v is None:
            continue
        try:
            x = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(x):
            out[str(k)] = x
    return out


def flatten(d: dict, prefix: str = "", sep: str = "/") -> dict:
    """A nested dict as one level: ``{"val": {"mean": 0.3}}`` -> ``{"val/mean": 0.3}``."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(v, key, sep))
        else:
            out[key] = v
    return out


def end_status(exc: BaseException | None) -> tuple[str, int]:
    """(status, exit code) of a run that ended with ``exc`` (None: it returned).

    Returns:
        ``("FINISHED", 0)``; ``("KILLED", 130 or 143)`` for ``KeyboardInterrupt`` or any exception after a
        recorded SIGINT / SIGTERM (:mod:`engine.interrupts`: vLLM's ``EngineDeadError`` after Ctrl-C);
        ``("FAILED", 1)`` for any other exception (``SystemExit`` with code 0 or None counts as finished).
    """
    from engine import interrupts

    if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
        return "FINISHED", 0
    if isinstance(exc, KeyboardInterrupt) or interrupts.requested():
        return "KILLED", interrupts.exit_status()
    return "FAILED", 1


class Tracker:
    """The tracker interface; this class itself records nothing (``logger=none``).

    Steps are the run's: a generation (essa train) or an optimiser step (essa grpo).
    """

    name = "none"

    def log_metrics(self, row: dict, step: int) -> None:
        """One metrics.parquet row (its numeric columns) at ``step``."""

    def log_validation(self, step: int, accuracies: dict[str, float]) -> None:
        """Held-out accuracy per condition (``{condition: fraction in [0, 1]}``) at ``step``, as ``val/<condition>``."""

    def log_summary(self, summary: dict) -> None:
        """The final summary (summary.json's dict): its numbers as ``summary/<key>``."""

    def log_config(self, config: dict) -> None:
        """The resolved config (a plain nested dict)."""

    def log_images(self, images: dict[str, str | Path]) -> None:
        """PNG files (the report's figures): ``{name: path}``."""

    def close(self, status: str = "FINISHED", exit_code: int = 0) -> None:
        """Flush and finish, recording how the run ended (:func:`end_status`); later calls are not expected."""


class TensorBoardTracker(Tracker):
    """TensorBoard event files through torch's ``SummaryWriter`` in ``log_dir``."""

    name = "tensorboard"

    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def log_metrics(self, row: dict, step: int) -> None:
        for k, v in scalars(row, STEP_KEYS).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def log_validation(self, step: int, accuracies: dict[str, float]) -> None:
        for k, v in scalars(accuracies).items():
            self.writer.add_scalar(f"val/{k}", v, step)
        self.writer.flush()

    def log_summary(self, summary: dict) -> None:
        for k, v in scalars(flatten(summary)).items():
            self.writer.add_scalar(f"summary/{k}", v, 0)
        self.writer.add_text("summary", f"```\n{json.dumps(summary, indent=1, default=str)}\n```")
        self.writer.flush()

    def log_config(self, config: dict) -> None:
        self.writer.add_text("config", f"```\n{json.dumps(config, indent=1, default=str)}\n```")

    def log_images(self, images: dict[str, str | Path]) -> None:
        from matplotlib.image import imread

        for name, path in images.items():
            self.writer.add_image(f"report/{name}", imread(str(path)), 0, dataformats="HWC")  # (H, W, C) floats
        self.writer.flush()

    def close(self, status: str = "FINISHED", exit_code: int = 0) -> None:
        self.writer.add_text("status", f"{status} (exit code {exit_code})")
        self.writer.close()


class MLflowTracker(Tracker):
    """One MLflow run (``MlflowClient``, no global active run) in experiment ``experiment`` at ``uri``.

    MLflow 3 keeps its file store (``file:`` URIs) in maintenance mode and refuses it unless
    ``MLFLOW_ALLOW_FILE_STORE=true``; for a ``file:`` URI that variable is set (when unset) in this process.
    A database (``logger.tracking_uri=sqlite:///<path>/mlflow.db``) or a server URI works as well.
    """

    name = "mlflow"
    MAX_PARAMS = 100  # params per log_batch call (MLflow's limit)

    def __init__(self, uri: str, experiment: str, run_name: str):
        from mlflow.tracking import MlflowClient

        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")

        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id

    def _metrics(self, values: dict[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def log_metrics(self, row: dict, step: int) -> None:
        self._metrics(scalars(row, STEP_KEYS), step)

    def log_validation(self, step: int, accuracies: dict[str, float]) -> None:
        self._metrics({f"val/{k}": v for k, v in scalars(accuracies).items()}, step)

    def log_summary(self, summary: dict) -> None:
        self._metrics({f"summary/{k}": v for k, v in scalars(flatten(summary)).items()}, 0)
        self.client.log_dict(self.run_id, summary, "summary.json")

    def log_config(self, config: dict) -> None:
        from mlflow.entities import Param

        params = [Param(k[:250], str(v)[:6000]) for k, v in flatten(config, sep=".").items()]
        for i in range(0, len(params), self.MAX_PARAMS):
            self.client.log_batch(self.run_id, params=params[i:i + self.MAX_PARAMS])
        self.client.log_dict(self.run_id, config, "config.json")

    def log_images(self, images: dict[str, str | Path]) -> None:
        for path in images.values():
            self.client.log_artifact(self.run_id, str(path), "report")

    def close(self, status: str = "FINISHED", exit_code: int = 0) -> None:
        self.client.set_terminated(self.run_id, status=status)


def _reachable(host: str, port: int = 443, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to ``host:port`` opens within ``timeout_s`` (DNS included: a thread)."""
    import socket

    ok = []

    def probe():
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout_s + 0.5)
    return bool(ok)


def wandb_mode(offline: bool | None) -> tuple[str, str]:
    """(W&B mode, why): ``logger.offline`` when set, else ``$WANDB_MODE``, else online only with an API key
    (``$WANDB_API_KEY`` or ``wandb login``'s netrc entry) and a reachable W&B host."""
    import netrc
    from urllib.parse import urlparse

    if offline is not None:
        return ("offline" if offline else "online"), f"logger.offline={str(offline).lower()}"
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"], f"WANDB_MODE={os.environ['WANDB_MODE']}"
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        key = os.environ.get("WANDB_API_KEY") or (netrc.netrc().authenticators(host) or (None,))[0]
    except (OSError, netrc.NetrcParseError):
        key = None
    if not key:
        return "offline", "no W&B API key in WANDB_API_KEY or from `wandb login`"
    if not _reachable(host):
        return "offline", f"{host} is unreachable"
    return "online", f"{host} reachable"


class WandbTracker(Tracker):
    """One W&B run in ``directory`` (mode by :func:`wandb_mode`); every series is plotted against ``step``."""

    name = "wandb"

    def __init__(self, directory: Path, project: str, run_name: str, offline: bool | None):
        import wandb

        mode, why = wandb_mode(offline)
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=run_name, dir=str(directory), mode=mode,
                              settings=wandb.Settings(console="off", x_disable_stats=True, silent=True,
                                                      x_save_requirements=False))
        where = f"; upload later with `wandb sync {self.run.dir.rsplit('/files', 1)[0]}`" if mode == "offline" else ""
        log.info("logger=wandb: %s (%s)%s", mode, why, where)
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log_metrics(self, row: dict, step: int) -> None:
        self.run.log({**scalars(row, STEP_KEYS), "step": step})

    def log_validation(self, step: int, accuracies: dict[str, float]) -> None:
        self.run.log({**{f"val/{k}": v for k, v in scalars(accuracies).items()}, "step": step})

    def log_summary(self, summary: dict) -> None:
        self.run.summary.update({f"summary/{k}": v for k, v in scalars(flatten(summary)).items()})

    def log_config(self, config: dict) -> None:
        self.run.config.update(config, allow_val_change=True)

    def log_images(self, images: dict[str, str | Path]) -> None:
        import wandb

        self.run.log({f"report/{name}": wandb.Image(str(path)) for name, path in images.items()})

    def close(self, status: str = "FINISHED", exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)


class SafeTracker(Tracker):
    """Wraps a tracker so that it cannot stop or corrupt the run: the first exception of any call logs one
    warning line naming the tracker and the call, closes it and disables it for the rest of the run."""

    def __init__(self, inner: Tracker):
        self.inner, self.name, self.disabled = inner, inner.name, False

    def _call(self, method: str, *args, **kwargs) -> None:
        if self.disabled:
            return
        try:
            getattr(self.inner, method)(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any tracker failure; KeyboardInterrupt still stops the run
            self.disabled = True
            first = (str(e).strip().splitlines() or [""])[0][:200]
            log.warning("logger=%s: %s failed (%s: %s); the tracker is off for the rest of the run (the run "
                        "directory's files hold everything)", self.name, method, type(e).__name__, first)
            if method != "close":
                try:
                    self.inner.close()
                except Exception:  # noqa: BLE001 - it already failed once
                    pass

    def log_metrics(self, row: dict, step: int) -> None:
        self._call("log_metrics", row, step)

    def log_validation(self, step: int, accuracies: dict[str, float]) -> None:
        self._call("log_validation", step, accuracies)

    def log_summary(self, summary: dict) -> None:
        self._call("log_summary", summary)

    def log_config(self, config: dict) -> None:
        self._call("log_config", config)

    def log_images(self, images: dict[str, str | Path]) -> None:
        self._call("log_images", images)

    def close(self, status: str = "FINISHED", exit_code: int = 0) -> None:
        self._call("close", status=status, exit_code=exit_code)
        self.disabled = True


def _open(logger, run_dir: Path, run_name: str) -> Tracker:
    """The tracker ``logger.name`` names, opened (may raise: :func:`make_tracker` catches)."""
    base = Path(logger.dir) if logger.dir else None
    if logger.name == "tensorboard":
        return TensorBoardTracker(base or run_dir / "tensorboard")
    if logger.name == "mlflow":
        uri = logger.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or \
            f"file:{(base or run_dir / 'mlruns').resolve()}"
        return MLflowTracker(uri, logger.project, run_name)
    if logger.name == "wandb":
        return WandbTracker(base or run_dir, logger.project, run_name, logger.offline)
    return Tracker()


def make_tracker(logger, run_dir: str | Path, config: dict | None = None, label: str | None = None) -> Tracker:
    """The run's tracker from the ``logger`` group, with ``config`` logged: a no-op for ``logger=none``,
    else a :class:`SafeTracker`. A tracker that cannot start (a server that does not answer, a full disk)
    logs one warning line and the run goes on without it.

    Args:
        logger: the ``logger`` group (engine/config.py ``LoggerConfig``).
        run_dir: the run directory (trackers write under it unless ``logger.dir`` is set).
        config: the resolved config (a plain dict), or None.
        label: the run's name when ``logger.run_name`` is null (the report label), else the directory's name.
    """
    if logger.name == "none":
        return Tracker()
    run_dir = Path(run_dir)
    try:
        inner = _open(logger, run_dir, logger.run_name or label or run_dir.name)
    except Exception as e:  # noqa: BLE001 - a tracker never stops the run
        first = (str(e).strip().splitlines() or [""])[0][:200]
        log.warning("logger=%s: cannot start (%s: %s); the run goes on without it", logger.name, type(e).__name__,
                    first)
        return Tracker()
    tracker = SafeTracker(inner)
    if config is not None:
        tracker.log_config(config)
    return tracker
