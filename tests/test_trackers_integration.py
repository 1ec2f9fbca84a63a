"""End-to-end trackers: the real `essa train` CLI (real vLLM on CPU, the embedded default model, the generated
default task) with ``logger=tensorboard|mlflow|wandb``; each tracker's own reader must give back the fitness and
validation series that metrics.parquet and validation.parquet hold."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import io

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
ESSA = str(Path(sys.executable).parent / "essa")
OVERRIDES = ["+experiment=tiny", "task.val_size=4", "sft.max_steps=2", "sft.batch_size=2", "sft.max_length=160",
             "rollout.prompts_per_generation=2", "rollout.max_tokens=16", "eval.max_tokens=16",
             "engine.kv_cache_gib=1", "model.max_model_len=512"]


def train(run_dir: Path, logger: str, **env) -> tuple[list[dict], dict]:
    """Run one tiny `essa train` with ``logger``; returns (metrics rows, {(step, condition): accuracy})."""
    proc = subprocess.run([ESSA, "train", *OVERRIDES, f"logger={logger}", f"hydra.run.dir={run_dir}"], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "failed" not in proc.stdout.split("logger=")[-1][:200], proc.stdout[-3000:]  # no tracker warning
    metrics = io.read_rows(run_dir / "metrics.parquet")
    val = {(r["step"], r["condition"]): r["accuracy"] for r in io.read_rows(run_dir / "validation.parquet")}
    assert [m["generation"] for m in metrics] == [0, 1] and (0, "no_adapter") in val and (2, "mean") in val
    return metrics, val


def expected(metrics: list[dict], val: dict) -> tuple[list, dict]:
    return [(m["generation"], pytest.approx(m["fitness_mean"])) for m in metrics], \
        {cond: sorted((s, pytest.approx(a)) for (s, c), a in val.items() if c == cond) for _, cond in val}


@pytest.mark.slow  # MLflow runs the same path in make test; make test-all
def test_tensorboard_events_hold_the_series(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    metrics, val = train(tmp_path, "tensorboard")
    ea = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    ea.Reload()
    fitness, conds = expected(metrics, val)
    assert [(e.step, e.value) for e in ea.Scalars("fitness_mean")] == fitness
    for cond, series in conds.items():
        assert [(e.step, e.value) for e in ea.Scalars(f"val/{cond}")] == series, cond
    final = io.read_json(tmp_path / "summary.json")["val"]["mean"]
    assert ea.Scalars("summary/val/mean")[0].value == pytest.approx(final)


def test_mlflow_run_holds_the_series(tmp_path, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    metrics, val = train(tmp_path, "mlflow")
    uri = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    runs = mlflow.search_runs(experiment_names=["essa"], output_format="list")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.params["strategy.population_size"] == "4"
    client, run_id = MlflowClient(uri), runs[0].info.run_id
    fitness, conds = expected(metrics, val)
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "fitness_mean")] == fitness
    for cond, series in conds.items():
        assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, f"val/{cond}")) == series, cond


@pytest.mark.slow  # MLflow runs the same path in make test; make test-all
def test_wandb_offline_run_holds_the_series(tmp_path):
    from tests.helpers import wandb_history

    metrics, val = train(tmp_path, "wandb", WANDB_MODE="offline")
    rows = wandb_history(tmp_path / "wandb")
    fitness, conds = expected(metrics, val)
    assert [(r["step"], r["fitness_mean"]) for r in rows if "fitness_mean" in r] == fitness
    for cond, series in conds.items():
        assert sorted((r["step"], r[f"val/{cond}"]) for r in rows if f"val/{cond}" in r) == series, cond
