"""Experiment trackers (engine/results/trackers.py): each backend read back with its own reader, and a
tracker that fails never stops the run or its files (no vLLM, seconds)."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest

from engine import io
from engine.config import ConfigError, LoggerConfig, check_logger
from engine.results.run_files import MetricsLog, ValidationLog, final_summary
from engine.results.trackers import SafeTracker, Tracker, end_status, flatten, make_tracker, scalars, wandb_mode
from engine.tasks import Problem


def logger_cfg(name: str, **kw) -> LoggerConfig:
    return LoggerConfig(name=name, **kw)


def drive(tracker, run_dir, png=None) -> None:
    """What essa train sends: two generations of metrics, validations at steps 0 and 2, the summary."""
    problems = [Problem(f"t/val/{i}", "q", "1") for i in range(4)]
    metrics = MetricsLog(run_dir, tracker)
    val = ValidationLog(run_dir, "essa", problems, lambda: 1.0, tracker)
    val.add(0, {"no_adapter": np.array([0.0, 0.0, 1.0, 0.0])})
    for g in range(2):
        metrics.add({"generation": g, "fitness_mean": 0.25 * (g + 1), "sigma": 0.1, "fitness_center": float("nan"),
                     "note": "text is left out"})
    val.add(2, {"sft": np.array([1.0, 0.0, 1.0, 0.0]), "mean": np.array([1.0, 1.0, 1.0, 0.0])})
    final_summary(run_dir, val.summary(), "t", "", tracker=tracker, generations=2)
    if png is not None:
        tracker.log_images({"figure": png})
    tracker.close()


@pytest.fixture
def png(tmp_path):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2), dpi=50)
    fig.add_subplot().plot([0, 1], [0, 1])
    path = tmp_path / "figure.png"
    fig.savefig(path)
    return path


def test_scalars_keep_finite_numbers_only():
    assert scalars({"a": 1, "b": float("nan"), "c": "x", "d": None, "e": True, "generation": 3}, ("generation",)) == \
        {"a": 1.0, "e": 1.0}
    assert flatten({"val": {"mean": 0.3, "sft": 0.2}, "n": 4}) == {"val/mean": 0.3, "val/sft": 0.2, "n": 4}


def test_tensorboard_event_files_hold_the_series(tmp_path, png):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    drive(make_tracker(logger_cfg("tensorboard"), tmp_path, {"seed": 0}), tmp_path, png)
    ea = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    ea.Reload()
    series = {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}
    assert series["fitness_mean"] == [(0, 0.25), (1, 0.5)]
    assert series["val/no_adapter"] == [(0, 0.25)] and series["val/mean"] == [(2, 0.75)]
    assert series["summary/val/mean"] == [(0, 0.75)]
    assert "fitness_center" not in series and "generation" not in series and "note" not in series  # NaN, step, text
    assert ea.Tags()["images"] == ["report/figure"]
    assert len(io.read_rows(tmp_path / "metrics.parquet")) == 2  # the files are written as without a tracker


def test_mlflow_file_store_holds_the_series(tmp_path, png, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    drive(make_tracker(logger_cfg("mlflow", run_name="r1"), tmp_path, {"strategy": {"sigma0": 0.1}}), tmp_path, png)
    uri = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # what search_runs reads
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses its file store without it
    runs = mlflow.search_runs(experiment_names=["essa"], output_format="list")
    assert len(runs) == 1 and runs[0].info.run_name == "r1" and runs[0].info.status == "FINISHED"
    client, run_id = MlflowClient(uri), runs[0].info.run_id
    history = lambda key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]  # noqa: E731
    assert history("fitness_mean") == [(0, 0.25), (1, 0.5)]
    assert history("val/mean") == [(2, 0.75)] and history("val/no_adapter") == [(0, 0.25)]
    assert runs[0].data.params["strategy.sigma0"] == "0.1"
    assert {a.path for a in client.list_artifacts(run_id)} >= {"config.json", "summary.json", "report"}


def test_wandb_offline_history_holds_the_series(tmp_path, png, monkeypatch):
    import wandb

    from tests.helpers import wandb_history

    monkeypatch.setenv("WANDB_MODE", "offline")
    drive(make_tracker(logger_cfg("wandb"), tmp_path, {"seed": 0}), tmp_path, png)
    wandb.teardown()  # the W&B core process writes the log behind run.finish(); as at the end of a run's process
    rows = wandb_history(tmp_path / "wandb")
    fitness = [(r["step"], r["fitness_mean"]) for r in rows if "fitness_mean" in r]
    assert fitness == [(0, 0.25), (1, 0.5)]
    assert [(r["step"], r["val/mean"]) for r in rows if "val/mean" in r] == [(2, 0.75)]
    assert any(r.get("report/figure/_type") == "image-file" for r in rows)


ENDINGS = [(None, "FINISHED", 0), (RuntimeError("engine died"), "FAILED", 1), (KeyboardInterrupt(), "KILLED", 130)]
"""How a run ends -> (MLflow status, W&B exit code): returned, raised, Ctrl-C."""


def end(tmp_path, name: str, exc):
    """Open the real tracker ``name`` in ``tmp_path``, log one row and close it as a run ending with ``exc``."""
    from engine import interrupts

    interrupts.reset()
    tracker = make_tracker(logger_cfg(name, run_name="r1"), tmp_path, {"seed": 0})
    tracker.log_metrics({"fitness_mean": 0.5}, 0)
    tracker.close(*end_status(exc))


@pytest.mark.parametrize("exc,status,code", ENDINGS, ids=["returned", "raised", "ctrl-c"])
def test_mlflow_records_a_failed_or_interrupted_run_as_such(tmp_path, monkeypatch, exc, status, code):
    import mlflow

    end(tmp_path, "mlflow", exc)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    runs = mlflow.search_runs(experiment_names=["essa"], output_format="list")
    assert [r.info.status for r in runs] == [status]


@pytest.mark.parametrize("exc,status,code", ENDINGS, ids=["returned", "raised", "ctrl-c"])
def test_wandb_records_the_exit_code(tmp_path, monkeypatch, exc, status, code):
    import wandb

    from tests.helpers import wandb_exit_codes

    monkeypatch.setenv("WANDB_MODE", "offline")
    end(tmp_path, "wandb", exc)
    wandb.teardown()
    assert wandb_exit_codes(tmp_path / "wandb") == [code]


@pytest.mark.parametrize("exc,status,code", ENDINGS, ids=["returned", "raised", "ctrl-c"])
def test_tensorboard_records_how_the_run_ended(tmp_path, exc, status, code):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    end(tmp_path, "tensorboard", exc)
    ea = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    ea.Reload()
    [event] = ea.Tensors("status/text_summary")
    assert make_ndarray(event.tensor_proto).item().decode() == f"{status} (exit code {code})"


def test_an_error_after_ctrl_c_ends_killed_and_sigterm_gives_143():
    import signal

    from engine import interrupts

    interrupts.reset()
    assert end_status(SystemExit(0)) == ("FINISHED", 0) and end_status(ValueError()) == ("FAILED", 1)
    interrupts._count, interrupts._last = 1, signal.SIGTERM  # what the handler records for a SIGTERM
    try:
        assert end_status(RuntimeError("EngineDeadError")) == ("KILLED", 143)
    finally:
        interrupts.reset()


def test_wandb_mode_prefers_the_setting_then_the_environment_then_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no API key
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert wandb_mode(True)[0] == "offline" and wandb_mode(False)[0] == "online"
    mode, why = wandb_mode(None)
    assert mode == "offline" and "API key" in why  # no key: offline without touching the network
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode(None) == ("disabled", "WANDB_MODE=disabled")


class Failing(Tracker):
    """A tracker whose every log call raises; counts the calls it received."""

    name = "fake"

    def __init__(self):
        self.calls = 0
        self.closed = 0

    def log_metrics(self, row, step):
        self.calls += 1
        raise ConnectionError("server went away\nsecond line")

    log_validation = log_summary = log_images = log_config = lambda self, *a: Failing.log_metrics(self, {}, 0)

    def close(self, status="FINISHED", exit_code=0):
        self.closed += 1


def test_a_failing_tracker_warns_once_and_the_run_files_are_whole(tmp_path, caplog):
    inner = Failing()
    with caplog.at_level(logging.WARNING, logger="essa"):
        drive(SafeTracker(inner), tmp_path)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "logger=fake: log_validation failed (ConnectionError: server went away)" in \
        warnings[0] and "\n" not in warnings[0]
    assert inner.calls == 1 and inner.closed == 1  # disabled after the first failure, closed once
    assert [r["generation"] for r in io.read_rows(tmp_path / "metrics.parquet")] == [0, 1]
    assert {(r["step"], r["condition"]) for r in io.read_rows(tmp_path / "validation.parquet")} == \
        {(0, "no_adapter"), (2, "sft"), (2, "mean")}
    assert io.read_json(tmp_path / "summary.json")["val"]["mean"] == 0.75


def test_a_tracker_that_cannot_start_leaves_a_no_op(tmp_path, caplog, monkeypatch):
    import engine.results.trackers as trackers

    def broken(*a, **kw):
        raise OSError("read-only file system")

    monkeypatch.setattr(trackers, "TensorBoardTracker", broken)
    with caplog.at_level(logging.WARNING, logger="essa"):
        tracker = make_tracker(logger_cfg("tensorboard"), tmp_path, {"seed": 0})
    assert type(tracker) is Tracker
    assert any("logger=tensorboard: cannot start (OSError: read-only file system)" in r.getMessage()
               for r in caplog.records)
    drive(tracker, tmp_path)  # the run goes on
    assert len(io.read_rows(tmp_path / "metrics.parquet")) == 2


def test_logger_none_is_a_no_op_and_a_missing_package_is_refused(monkeypatch):
    import importlib.util

    assert type(make_tracker(logger_cfg("none"), "/nonexistent")) is Tracker
    with pytest.raises(ConfigError, match=r"logger.name='neptune': use one of none, tensorboard, mlflow, wandb"):
        check_logger(SimpleNamespace(name="neptune"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: None if m == "wandb" else real(m, *a))
    with pytest.raises(ConfigError) as e:
        check_logger(SimpleNamespace(name="wandb"))
    assert str(e.value) == ('logger=wandb: the wandb package is not installed; pip install "essa-engine[trackers]" '
                            '(or wandb), or logger=none')
    check_logger(SimpleNamespace(name="mlflow"))  # installed: no error


def test_the_lab_sends_each_settings_curves_summary_and_figure(tmp_path):
    from hydra import compose, initialize_config_dir
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from engine.commands import register_configs
    from engine.commands.lab import main
    from engine.config import CONF_DIR

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("lab", overrides=["logger=tensorboard", "n_seeds=2", "generations=3", "progress=false"])
    main(cfg, tmp_path)
    ea = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    ea.Reload()
    rows = io.read_rows(tmp_path / "lab.parquet")
    held_out = [(e.step, e.value) for e in ea.Scalars("essa/held_out")]
    assert held_out == [(g, pytest.approx(np.mean([r["held_out"] for r in rows if r["generation"] == g])))
                        for g in range(3)]  # the mean over seeds per generation
    assert "essa/seed" not in ea.Tags()["scalars"] and ea.Tags()["images"] == ["report/lab_progress"]
