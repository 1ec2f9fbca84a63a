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

from engine.lora.files import read_adapter

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
    (run / "stdout.txt").write_text(out)  # vLLM's engine-config line names the dtype it ran with
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
    # the base model at the start, the mean genome every generation, mean + best exports at the end beside
    # the warm start, scored once there (one engine call, so the paired test does not carry drift between
    # calls; issue 26: no adapter is scored twice where one paired score serves)
    assert conds == {(0, "no_adapter"), (1, "mean"), (2, "sft"), (2, "mean"), (2, "best")}
    assert all(v["n_problems"] == 4 for v in val)
    roll = pq.read_table(full_run / "rollouts" / "gen_000001.parquet").to_pylist()
    assert len(roll) == (4 + 1) * 2  # (P + centre) x N x G
    assert {r["candidate"] for r in roll} == {0, 1, 2, 3, 4}
    # issue 11: the centre (index P) is a paired control: same prompts as every candidate, and its
    # fitness is logged beside the population's with the signal diagnostics
    prompts_of = lambda c: sorted(r["prompt_id"] for r in roll if r["candidate"] == c)  # noqa: E731
    assert all(prompts_of(c) == prompts_of(4) for c in range(4))
    assert [r["center"] for r in roll] == [r["candidate"] == 4 for r in roll]
    centre_fitness = np.mean([r["reward"] for r in roll if r["candidate"] == 4])
    assert metrics[1]["fitness_center"] == pytest.approx(centre_fitness)
    for key in ("split_half_rho", "variance_ratio", "prompts_disagreeing"):
        assert key in metrics[1]
    assert 0 <= metrics[1]["prompts_disagreeing"] <= 2
    assert all(r["status"] in ("correct", "wrong", "no_answer", "timeout", "error") for r in roll)
    assert {"extracted_answer", "completion", "prompt_id", "reward"} <= set(roll[0])
    assert (full_run / "checkpoint.pkl").exists() and (full_run / "run.json").exists()
    # honest final statistics: per-problem validation rows, Wilson intervals, paired test vs the warm start
    import json

    prob = pq.read_table(full_run / "validation_problems.parquet").to_pylist()
    final = [r for r in prob if r["step"] == 2 and r["condition"] == "mean"]
    assert len(final) == 4 and all(r["reward"] in (0.0, 1.0) for r in final)
    summary = json.loads((full_run / "summary.json").read_text())
    lo, hi = summary["val_ci95"]["mean"]
    assert 0.0 <= lo <= summary["val"]["mean"] <= hi <= 1.0
    paired = summary["paired_vs_sft"]["mean"]
    assert 0.0 <= paired["p_value"] <= 1.0 and paired["n"] == 4
    assert paired["diff"] == pytest.approx(summary["val"]["mean"] - summary["val"]["sft"])


def test_auto_dtype_resolves_here_and_the_engine_runs_with_it(full_run: Path):
    # issue 10: model.dtype defaults to auto; this machine's choice is logged, recorded in run.json and
    # is the dtype vLLM was started with (bf16 only where the CPU has AVX512-BF16/AMX, else float32).
    import json

    from engine.hardware import resolve_dtype

    expected, reason = resolve_dtype("auto", log_choice=False)
    rec = json.loads((full_run / "run.json").read_text())["dtype"]
    assert rec["requested"] == "auto" and rec["dtype"] == expected and rec["reason"] == reason
    assert rec["device"]["cpu"]["cores"] >= 1 and set(rec["device"]["cpu"]["flags"]) >= {"avx2", "amx_bf16"}
    out = (full_run / "stdout.txt").read_text()
    assert f"dtype auto -> {expected} ({reason})" in out
    assert f"vLLM engine up (dtype {expected})" in out  # the dtype the engine was built with (VLLMBackend)


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
    """Ctrl-C after generation 0 as a terminal sends it: SIGINT to the whole process group, so vLLM's
    EngineCore gets it too (engine/interrupts.py). Also where the test runner inherited SIGINT ignored,
    as a CI job started in the background by a shell without job control does."""
    run = tmp_path / "resumed"
    proc = essa(run, start_new_session=True)  # its own process group: essa, EngineCore, workers
    first = run / "checkpoint.pkl"  # written right after generation 0's logs (its rollouts come a moment earlier)
    deadline = time.time() + 900
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    assert first.exists(), finish(proc)[-3000:]
    os.killpg(proc.pid, signal.SIGINT)
    out = finish(proc)
    assert proc.returncode == 130, f"the run was expected to stop on Ctrl-C (exit {proc.returncode}): {out[-2000:]}"
    assert f"interrupted: checkpoint of generation 0 in {run / 'checkpoint.pkl'}" in out and "resume=" in out, \
        out[-2000:]
    assert (run / "checkpoint.pkl").exists()

    proc = essa(tmp_path / "hydra2", f"resume={run}")
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]
    metrics = pq.read_table(run / "metrics.parquet").to_pylist()
    assert [m["generation"] for m in metrics] == [0, 1]
    run_log = (run / "train.log").read_text()   # one run, one log: the resumed part is appended there
    assert "resume: logging to" in run_log and "gen 1 (" in run_log.split("resume: logging to")[1], run_log[-2000:]
    a, _ = read_adapter(full_run / "adapters" / "mean")
    b, _ = read_adapter(run / "adapters" / "mean")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k].numpy(), b[k].numpy(), err_msg=k)


@pytest.mark.slow  # the deadline test covers the same stop; make test-all
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
    assert summary["generations"] == 1 and summary["wall_s"] > 0 and summary["stopped_by"] == "time_budget_s"
    assert (run / "adapters" / "mean" / "adapter_model.safetensors").exists()


def test_deadline_stops_before_a_generation_that_would_not_fit(tmp_path: Path):
    """deadline_s (make run's wall-clock limit, issue 10): the first generation always runs; the
    next one would end past a 1-second deadline, so the run validates and exports after one. The
    final call's extras are not reserved (issue 26: generations first) and are skipped, each saying how
    to get it: the base model's score (not cached here: an empty baseline cache) and the sampled pass."""
    import json

    from engine.model import cache_dir

    cache = tmp_path / "cache"  # the model and SFT caches, but an empty baseline cache
    cache.mkdir()
    for sub in ("models", "sft"):
        (cache_dir() / sub).mkdir(parents=True, exist_ok=True)
        (cache / sub).symlink_to(cache_dir() / sub)
    run = tmp_path / "deadline"
    proc = essa(run, "generations=50", "deadline_s=1", "eval.every=1", "report=false", "eval.samples=2",
                "eval.sample_problems=4", env={**os.environ, "ESSA_CACHE": str(cache)})
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]
    assert "deadline_s 1: stopping after gen 0 (1 of 50)" in out and "stopped by deadline_s after 1 of 50" in out
    assert "deadline_s 1: the base model's held-out score is not cached" in out
    assert "deadline_s 1: skipping the base model" in out and "DEADLINE_S=null" in out
    assert "deadline_s 1: skipping the sampled pass" in out and "essa eval adapters=[" in out
    assert "mean@2" not in out and "skipped so that generations fit deadline_s (1 of 50 ran): base model, sampled pass" in out
    assert [m["generation"] for m in pq.read_table(run / "metrics.parquet").to_pylist()] == [0]
    # the periodic validation due after generation 0 is skipped: the final call scores the mean once
    conds = [(v["step"], v["condition"]) for v in pq.read_table(run / "validation.parquet").to_pylist()]
    assert sorted(conds) == [(1, "best"), (1, "mean"), (1, "sft")]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["generations"] == 1 and summary["stopped_by"] == "deadline_s" and "sampled" not in summary
    assert summary["skipped_by_deadline"] == ["base model", "sampled pass"]
    assert not list((cache / "baselines").glob("*.json"))  # nothing cached that was not scored
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


@pytest.mark.parametrize("strategy", ["lra_cma", pytest.param("openai_es", marks=pytest.mark.slow)])  # slow: make test-all
def test_new_strategies_run_the_tiny_experiment(tmp_path: Path, strategy: str):
    """strategy=lra_cma and strategy=openai_es through the real engine (+experiment=tiny), with the dense
    reward as tie-breaker and the mean's decay on: metrics, the centre, and the final table."""
    import json

    run = tmp_path / strategy
    proc = essa(run, f"strategy={strategy}", "rollout.dense=tiebreak", "strategy.mean_decay=0.1",
                "eval.baselines=false", "eval.every=0", "report=false")
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]
    metrics = pq.read_table(run / "metrics.parquet").to_pylist()
    assert [m["generation"] for m in metrics] == [0, 1]
    assert all(m["dense_mean"] < 0 and m["t_dense"] > 0 and m["mean_norm"] >= 0 for m in metrics)
    roll = pq.read_table(run / "rollouts" / "gen_000000.parquet").to_pylist()
    assert all(r["dense"] <= 0 for r in roll)  # a log-probability of the reference answer
    assert json.loads((run / "summary.json").read_text())["generations"] == 2


def test_likelihood_fitness_runs_the_tiny_experiment(tmp_path: Path):
    """rollout.fitness=likelihood through the real engine: no rollouts are generated, each candidate's
    fitness is the mean log-probability per token of the minibatch's worked solutions (<= 0), logged
    per problem in the rollout files, and the run validates greedy accuracy as usual."""
    import json

    run = tmp_path / "likelihood"
    proc = essa(run, "rollout.fitness=likelihood", "eval.baselines=false", "eval.every=0", "report=false")
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]
    metrics = pq.read_table(run / "metrics.parquet").to_pylist()
    assert [m["generation"] for m in metrics] == [0, 1]
    assert all(m["fitness_max"] < 0 and m["tokens"] > 0 for m in metrics)
    roll = pq.read_table(run / "rollouts" / "gen_000001.parquet").to_pylist()
    assert {r["status"] for r in roll} == {"likelihood"} and len(roll) == (4 + 1) * 2
    assert all(r["reward"] < 0 for r in roll)
    assert json.loads((run / "summary.json").read_text())["generations"] == 2


def test_tinylora_genome_runs_the_tiny_experiment(tmp_path: Path):
    """strategy.genome.kind=tinylora (issue 39: TinyLoRA's u numbers, tied across modules) through the real
    engine: vLLM serves its candidates as ordinary rank-8 LoRA adapters, the run logs D = u, and the exported
    mean keeps the warm start's A factors while its B factors moved inside the warm start's SVD frame."""
    import json

    import torch

    run = tmp_path / "tinylora"
    proc = essa(run, "strategy.genome.kind=tinylora", "strategy.genome.u=4", "eval.baselines=false",
                "rollout.dense=tiebreak", "eval.every=0", "report=false")  # dense: 2 prompts rarely tie all 4
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]
    assert "genome tinylora (u 4, tied): D 4" in out
    metrics = pq.read_table(run / "metrics.parquet").to_pylist()
    assert [m["generation"] for m in metrics] == [0, 1] and all(m["tokens"] > 0 for m in metrics)
    meta = json.loads((run / "run.json").read_text())
    assert meta["genome_dim"] == 4
    sft_dir = Path(meta["sft_adapter"])
    mean, cfg = read_adapter(run / "adapters" / "mean")
    sft, _ = read_adapter(sft_dir)
    assert cfg["r"] == 8 and mean.keys() == sft.keys()
    assert all(torch.equal(mean[k], sft[k]) for k in sft if k.endswith("lora_A.weight"))
    assert any(not torch.equal(mean[k], sft[k]) for k in sft if k.endswith("lora_B.weight"))


def test_rounds_fold_the_correct_completions_into_the_next_warm_start(tmp_path: Path):
    """rounds.count=2 (issue 39) through the real engine and TRL: round 0 evolves, its correct completions are
    distilled into its mean adapter by SFT (fold_0), round 1 starts from that adapter, decomposed afresh, with
    its own seed; rounds.json and the printed table record both rounds. Arithmetic with 8 prompts and room for
    a whole answer, so that round 0 has correct completions to fold."""
    import json

    import torch

    run = tmp_path / "rounds"
    proc = subprocess.Popen(
        [ESSA, "train", "+experiment=tiny", "task.train_size=64", "task.val_size=4", "sft.max_steps=8",
         "rollout.prompts_per_generation=8", "rollout.max_tokens=64", "eval.max_tokens=64", "eval.every=0",
         "engine.kv_cache_gib=1", "model.max_model_len=512", "rounds.count=2", "rounds.fold_steps=2",
         "rounds.max_rows=16", f"hydra.run.dir={run}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]
    record = json.loads((run / "rounds.json").read_text())
    assert [e["round"] for e in record["rounds"]] == [0, 1] and not record["config"]["rounds"]["control"]
    fold = record["rounds"][0]["fold"]
    assert 1 <= fold["rows"] <= 16 and fold["steps"] == 2
    meta = json.loads((run / "round_1" / "run.json").read_text())
    assert Path(meta["sft_adapter"]) == run / "fold_0" and meta["seed"] == 1000
    folded, _ = read_adapter(run / "fold_0")
    mean, _ = read_adapter(run / "round_0" / "adapters" / "mean")
    assert folded.keys() == mean.keys() and any(not torch.equal(folded[k], mean[k]) for k in mean)
    assert all(set(e["val"]) >= {"sft", "mean"} for e in record["rounds"])
    assert "round  start   mean" in out
