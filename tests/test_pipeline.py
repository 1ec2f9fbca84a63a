"""End-to-end: the real `essa train` CLI with real vLLM on CPU, the real default model and real GSM8K rows.

SFT warm start -> 2 generations of ESSA (population 4, 2 prompts, short completions) -> exports;
then the same run interrupted with Ctrl-C (SIGINT) after its first generation and resumed must end
with the same mean genome as the uninterrupted run (greedy decoding).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from engine.adapters import read_adapter

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
ESSA = str(Path(sys.executable).parent / "essa")
OVERRIDES = [
    "task=gsm8k", "task.train_size=64", "task.val_size=4", "+experiment=tiny",
    "sft.max_steps=2", "sft.batch_size=2", "sft.max_length=160",
    "rollout.prompts_per_generation=2", "rollout.max_tokens=24", "eval.max_tokens=24", "eval.every=1",
    "engine.kv_cache_gib=1", "model.max_model_len=512",
]


def essa(run_dir: Path, *extra: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([ESSA, "train", *OVERRIDES, f"hydra.run.dir={run_dir}", *extra], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def finish(proc: subprocess.Popen, timeout: float = 900) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("full")
    proc = essa(run)
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]
    return run


def test_run_outputs(full_run: Path):
    metrics = pq.read_table(full_run / "metrics.parquet").to_pylist()
    assert [m["generation"] for m in metrics] == [0, 1]
    for m in metrics:
        assert 0.0 <= m["fitness_min"] <= m["fitness_mean"] <= m["fitness_max"] <= 1.0
        assert m["tokens"] > 0 and m["tokens_per_s"] > 0 and m["sigma"] > 0
        assert m["t_generate"] > 0
    val = pq.read_table(full_run / "validation.parquet").to_pylist()
    conds = {(v["step"], v["condition"]) for v in val}
    # baselines at the start, the mean genome every generation, mean + best exports at the end
    assert {(0, "no_adapter"), (0, "sft"), (1, "mean"), (2, "mean"), (2, "best")} <= conds
    assert all(v["n_problems"] == 4 for v in val)
    roll = pq.read_table(full_run / "rollouts" / "gen_000001.parquet").to_pylist()
    assert len(roll) == 4 * 2  # P x N x G
    assert {r["candidate"] for r in roll} == {0, 1, 2, 3}
    assert all(r["status"] in ("correct", "wrong", "no_answer", "timeout", "error") for r in roll)
    assert {"extracted_answer", "completion", "prompt_id", "reward"} <= set(roll[0])
    assert (full_run / "checkpoint.pkl").exists() and (full_run / "run.json").exists()
    assert (full_run / "summary.json").exists()


def test_export_loads_in_peft(full_run: Path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from engine.model import resolve_model_path

    lora, cfg = read_adapter(full_run / "adapters" / "mean")
    assert cfg["r"] == 8 and set(cfg["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path("embedded:smollm2-135m-instruct"),
                                                dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(full_run / "adapters" / "mean"))
    key = next(k for k in lora if k.endswith("layers.0.self_attn.q_proj.lora_A.weight"))
    loaded = dict(model.named_parameters())[key.replace(".lora_A.weight", ".lora_A.default.weight")]
    assert torch.allclose(loaded.float(), lora[key], atol=1e-6)
    # vLLM loaded the same export during the run: the final validation served adapters/mean and /best.


def test_interrupt_and_resume_matches_uninterrupted(full_run: Path, tmp_path: Path):
    run = tmp_path / "resumed"
    proc = essa(run)
    first = run / "rollouts" / "gen_000000.parquet"
    deadline = time.time() + 900
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    assert first.exists(), finish(proc)[-3000:]
    proc.send_signal(signal.SIGINT)
    out = finish(proc)
    assert proc.returncode != 0, "the run was expected to stop on Ctrl-C"
    assert "checkpoint" in out and "resume=" in out, out[-2000:]
    assert (run / "checkpoint.pkl").exists()

    proc = essa(tmp_path / "hydra2", f"resume={run}")
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]
    metrics = pq.read_table(run / "metrics.parquet").to_pylist()
    assert [m["generation"] for m in metrics] == [0, 1]
    a, _ = read_adapter(full_run / "adapters" / "mean")
    b, _ = read_adapter(run / "adapters" / "mean")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k].numpy(), b[k].numpy(), err_msg=k)


def test_time_budget_stops_after_first_generation(tmp_path: Path):
    """time_budget_s (equal-clock comparisons with GRPO): the run stops after the first generation that
    ends past the budget, then validates and exports as usual."""
    import json

    run = tmp_path / "budget"
    proc = essa(run, "generations=50", "time_budget_s=0.001", "eval.baselines=false", "report=false")
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]
    assert "time budget" in out
    assert [m["generation"] for m in pq.read_table(run / "metrics.parquet").to_pylist()] == [0]
    conds = {(v["step"], v["condition"]) for v in pq.read_table(run / "validation.parquet").to_pylist()}
    assert conds == {(1, "mean"), (1, "best")}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["generations"] == 1 and summary["wall_s"] > 0
    assert (run / "adapters" / "mean" / "adapter_model.safetensors").exists()


def test_bad_input_is_one_line_error(tmp_path: Path):
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    cases = {
        "strategy.population_size=1": "strategy.population_size",
        "strategy.name=nope": "strategy",
        "lora.rank=1000": "lora.rank",
        "time_budget_s=0": "time_budget_s",
        "model.path=/nonexistent/model": "model.path",
        f"resume={tmp_path}": "resume",
        "task=gsm8k task.path=/nonexistent": "task.path",
    }
    for override, field in cases.items():
        proc = subprocess.run([ESSA, "train", *override.split(), f"hydra.run.dir={tmp_path / 'r'}"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0, override
        err = [line for line in proc.stderr.splitlines() if line.startswith("essa: error:")]
        assert len(err) == 1 and field in err[0], (override, proc.stderr[-1500:])
