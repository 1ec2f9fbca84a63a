"""End-to-end reasoning-gym task: `essa train task=countdown +experiment=tiny` and `essa eval task=countdown` through
the real CLI (real vLLM on CPU, the embedded default model); every completion is scored by the countdown verifier
(rewards.GymReward), so the statuses in the rollouts and the eval samples are the gym reward's."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine import io

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
ESSA = str(Path(sys.executable).parent / "essa")
SMALL = ["task.train_size=64", "engine.kv_cache_gib=1", "model.max_model_len=512"]


def essa(*argv: str) -> str:
    proc = subprocess.run([ESSA, *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return proc.stdout


@pytest.mark.slow  # reasoning-gym end to end; its reward is unit-tested; make test-all
def test_countdown_trains_and_evaluates(tmp_path):
    run = tmp_path / "train"
    out = essa("train", "task=countdown", "+experiment=tiny", *SMALL, "task.val_size=4", "sft.max_steps=2",
               "sft.batch_size=2", f"hydra.run.dir={run}")
    assert "held-out accuracy on countdown (4 problems" in out
    summary = io.read_json(run / "summary.json")
    assert summary["task"] == "countdown" and set(summary["val"]) == {"no_adapter", "sft", "mean", "best"}
    rollouts = io.read_rows(run / "rollouts" / "gen_000001.parquet")
    assert {r["status"] for r in rollouts} <= {"correct", "wrong", "no_answer", "timeout"}
    assert all((r["reward"] == 1.0) == (r["status"] == "correct") for r in rollouts)  # binary: the verifier's 1.0 only
    assert io.read_json(run / "run.json")["config"]["task"]["gym"]["dataset"] == "countdown"

    out_dir = tmp_path / "eval"
    essa("eval", "task=countdown", *SMALL, "limit=4", "max_tokens=32", "save_completions=true",
         f"hydra.run.dir={out_dir}")
    result = io.read_json(out_dir / "eval_summary.json")
    assert result["task"] == "countdown" and result["n_problems"] == 4
    samples = io.read_rows(out_dir / "eval_samples.parquet")
    assert len(samples) == 4 and {s["status"] for s in samples} <= {"correct", "wrong", "no_answer", "timeout"}
