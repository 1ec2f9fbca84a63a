"""`essa grpo`: config, time budget, and one tiny real run through the CLI (default model, CPU)."""

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from engine.config import ConfigError

REPO = Path(__file__).resolve().parent.parent
ESSA = Path(sys.executable).parent / "essa"
VALIDATION_COLUMNS = ["step", "wall_s", "condition", "accuracy", "n_problems", "method"]


def compose(*overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from engine.commands import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return hydra_compose(config_name="grpo", overrides=list(overrides))


def test_config_composes_with_the_essa_defaults():
    from engine.commands.grpo_config import validate

    cfg = compose()
    validate(cfg)
    assert cfg.grpo.focal_gamma == 0 and cfg.grpo.num_generations == 8
    train = compose_train()
    assert (cfg.lora.rank, cfg.lora.alpha, list(cfg.lora.target_modules)) == \
        (train.lora.rank, train.lora.alpha, list(train.lora.target_modules))
    assert cfg.task.name == train.task.name and cfg.sft == train.sft and cfg.reward == train.reward


def compose_train():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from engine.commands import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return hydra_compose(config_name="train")


@pytest.mark.parametrize("override, field", [
    ("grpo.num_generations=1", "grpo.num_generations"),
    ("grpo.micro_batch_size=5", "grpo.micro_batch_size"),
    ("grpo.steps_per_generation=0", "grpo.steps_per_generation"),
    ("grpo.focal_gamma=-1", "grpo.focal_gamma"),
    ("grpo.correct_threshold=5", "grpo.correct_threshold"),  # above 1 + reward.format_weight: none correct
    ("grpo.correct_threshold=0", "grpo.correct_threshold"),  # at the reward's minimum: all correct
    ("grpo.correct_threshold=nan", "grpo.correct_threshold"),
    ("grpo.time_budget_s=0", "grpo.time_budget_s"),
    ("grpo.loss_type=ppo", "grpo.loss_type"),
    ("lora.rank=100000", "lora.rank"),
    ("grpo.top_p=2", "grpo.top_p"),
    ("grpo.temperature=-1", "grpo.temperature"),
    ("sft.max_steps=0", "sft"),
    ("grpo.generator=hf", "grpo.generator"),
    ("grpo.importance_sampling=sequence", "grpo.importance_sampling"),
    ("grpo.importance_sampling_cap=1", "grpo.importance_sampling_cap"),
    ("grpo.beta=-1", "grpo.beta"),
    ("grpo.beta=nan", "grpo.beta"),
    ("grpo.vllm_gpu_memory_utilization=0", "grpo.vllm_gpu_memory_utilization"),
    ("grpo.vllm_gpu_memory_utilization=2", "grpo.vllm_gpu_memory_utilization"),
    ("grpo.temperature=0", "grpo.temperature"),
    ("grpo.temperature=nan", "grpo.temperature"),
    ("grpo.max_completion_length=1024", "grpo.max_completion_length"),
    ("model.max_model_len=64", "grpo.max_completion_length"),
    ("lora.alpha=0", "lora.alpha"),
    ("lora.target_modules=[]", "lora.target_modules"),
    ("reward.timeout_s=0", "reward.timeout_s"),
])
def test_bad_config_names_the_field(override, field):
    from engine.commands.grpo_config import validate

    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        validate(compose(override))


@pytest.mark.parametrize("overrides, refused", [
    (("grpo.top_p=0.9",), True),                                          # the default token_truncate
    (("grpo.top_p=0.9", "grpo.importance_sampling=sequence_mask"), True),
    (("grpo.top_p=0.9", "grpo.importance_sampling=none"), False),         # no correction: nothing biased
    (("grpo.top_p=0.9", "grpo.generator=transformers"), False),           # the sampler is the trainer
    (("grpo.top_p=1.0",), False),
])
def test_top_p_with_importance_sampling_is_refused_at_start(overrides, refused):
    """Issue 29b (TRL 4159, 6789): the ratio is biased under top-p; refused in one line naming both fields."""
    from engine.commands.grpo_config import validate

    cfg = compose("grpo.temperature=0.7", *overrides)
    if not refused:
        validate(cfg)
        return
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("grpo.top_p=0.9 with grpo.importance_sampling=")
    assert "grpo.top_p=1.0" in msg and "grpo.importance_sampling=none" in msg and "grpo.generator=transformers" in msg


@pytest.mark.parametrize("fw, threshold, ok", [
    (0.1, 0.05, False),   # a wrong boxed answer scores 0.1: it would count as correct
    (0.1, 0.5, True), (0.1, 1.0, True),
    (-0.1, 1.0, False),   # a correct boxed answer scores 0.9: it would count as wrong
    (-0.1, 0.9, True),
])
def test_correct_threshold_separates_wrong_from_correct(fw, threshold, ok):
    from engine.commands.grpo_config import validate

    cfg = compose(f"reward.format_weight={fw}", f"grpo.correct_threshold={threshold}")
    if ok:
        validate(cfg)
    else:
        with pytest.raises(ConfigError, match=r"grpo\.correct_threshold"):
            validate(cfg)


def test_generation_batch_must_fit_the_training_set(caplog):
    from engine.commands.grpo_config import check_generation_batch

    g = compose("grpo.prompts_per_step=8", "grpo.steps_per_generation=10", "grpo.max_steps=20").grpo
    with pytest.raises(ConfigError, match=r"grpo\.steps_per_generation=10.*80 distinct prompts.*64 training"):
        check_generation_batch(g, 64)
    check_generation_batch(g, 80)
    assert not caplog.records
    g = compose("grpo.prompts_per_step=2", "grpo.steps_per_generation=2", "grpo.max_steps=3").grpo
    with caplog.at_level("WARNING", logger="essa.grpo"):
        check_generation_batch(g, 64)
    assert "max_steps=3 is not a multiple" in caplog.text


def test_time_budget_stops_training_and_validates():
    from engine.commands.grpo import _run_logger_class

    validated = []
    clock = iter([5.0, 12.0])
    g = compose("grpo.time_budget_s=10", "grpo.eval_every=0").grpo
    run = types.SimpleNamespace(time_budget_s=g.time_budget_s, eval_every=g.eval_every, clock=lambda: next(clock),
                                eval_s=0.0, validate=lambda step, model, final: validated.append((step, final)))
    cb = _run_logger_class()(run)
    for step, expect_stop in ((1, False), (2, True)):
        control = types.SimpleNamespace(should_training_stop=False)
        cb.on_step_end(None, types.SimpleNamespace(global_step=step), control, model=None)
        assert control.should_training_stop is expect_stop
    assert validated == [(2, True)]  # eval_every=0: only when stopping, as the final validation


def run_tiny_grpo(run_dir, *overrides: str) -> subprocess.CompletedProcess:
    """``essa grpo`` through the console script on the default model at toy size (2-step warm start,
    2 prompts x 4 rollouts, 2 steps, 32 new tokens, 4 held-out problems); asserts exit 0."""
    cmd = [str(ESSA),
        "grpo", "sft.max_steps=2", "sft.batch_size=4", "sft.max_length=192", "task.val_size=4",
        "task.train_size=64", "grpo.prompts_per_step=2", "grpo.num_generations=4",
        "grpo.max_steps=2", "grpo.max_completion_length=32", "grpo.eval_max_tokens=32", *overrides,
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_tiny_real_run(tmp_path):
    """Default model, 2 prompts x 4 rollouts, 2 steps of F-GRPO through the real CLI, rollouts and
    validation through the project's vLLM engine (grpo.generator=vllm, the default)."""
    import pyarrow.parquet as pq
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "run"
    run_tiny_grpo(run_dir, "grpo.focal_gamma=1.0", "grpo.eval_every=1")

    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["method"] == "f-grpo" and meta["label"] and meta["trl_version"].startswith("1.16.")
    assert meta["generation"] == "vllm"

    val = pq.read_table(run_dir / "validation.parquet").to_pylist()
    assert list(val[0]) == VALIDATION_COLUMNS
    # the final call scores the SFT adapter again beside the policy: the paired test's same-call control
    assert [(r["step"], r["condition"]) for r in val] == [(0, "sft"), (0, "policy"), (1, "policy"), (2, "policy"),
                                                          (2, "sft")]
    assert all(r["method"] == "f-grpo" and r["n_problems"] == 4 and 0 <= r["accuracy"] <= 1 for r in val)
    assert val[0]["accuracy"] == val[1]["accuracy"]
    walls = [r["wall_s"] for r in val]
    assert walls == sorted(walls) and walls[0] > 0
    # the same honest final statistics as essa train: per-problem rows, Wilson intervals, paired test
    prob = pq.read_table(run_dir / "validation_problems.parquet").to_pylist()
    assert len(prob) == 4 * len(val) and {r["reward"] for r in prob} <= {0.0, 1.0}
    summary = json.loads((run_dir / "summary.json").read_text())
    lo, hi = summary["val_ci95"]["policy"]
    assert lo <= summary["val"]["policy"] == val[-2]["accuracy"] == summary["accuracy"] <= hi
    assert summary["val"]["sft"] == val[-1]["accuracy"] == summary["sft_accuracy"]
    assert summary["paired_vs_sft"]["policy"]["n"] == 4 and 0 <= summary["paired_vs_sft"]["policy"]["p_value"] <= 1

    metrics = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    assert [r["step"] for r in metrics] == [1, 2]
    assert {"step", "wall_s", "reward_mean", "reward_std", "loss", "kl"} <= set(metrics[0])
    for r in metrics:  # vLLM rollouts, TRL's token-level importance sampling (cap 2) applied to them
        assert r["rollouts"] == 8 and r["t_generate"] > 0 and r["rollouts_per_s"] > 0
        assert 0 < r["is_ratio_mean"] <= 2.0 and r["logp_diff_mean"] >= 0

    # one adapter per optimiser step, a new id each; vLLM's token ids and logprobs line up
    rollouts = [pq.read_table(run_dir / "rollouts" / f"step_{s:06d}.parquet").to_pylist() for s in (0, 1)]
    assert [len(r) for r in rollouts] == [8, 8]
    assert len({r["adapter_id"] for step in rollouts for r in step}) == 2
    for r in rollouts[0] + rollouts[1]:
        assert len(r["completion_ids"]) == len(r["logprobs"]) == r["n_tokens"] >= 1
        assert all(lp is not None and lp <= 0 for lp in r["logprobs"])

    adapter = run_dir / "adapters" / "final"
    assert (adapter / "adapter_config.json").exists() and (adapter / "adapter_model.safetensors").exists()
    base = AutoModelForCausalLM.from_pretrained(meta["model_path"], dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(adapter))
    names = [n for n, _ in model.named_parameters() if "lora_A" in n]
    assert len(names) == 4 * base.config.num_hidden_layers
    assert not (run_dir / "trainer").exists()

    # essa report reads the real run directory: its step-keyed metrics, the F-GRPO validation curve
    from engine.results.report import make_report
    make_report([run_dir], tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| f-grpo | arithmetic | 2 |" in md and (tmp_path / "report" / "val_accuracy_wallclock.png").is_file()



@pytest.mark.slow  # test_tiny_real_run covers the vLLM rollout path; make test-all
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_generation_batch_spans_steps(tmp_path):
    """grpo.steps_per_generation=2: one vLLM call generates both steps' rollouts (2 x 2 prompts x 4),
    each step trains on its own half; the second step generates nothing."""
    import math

    import pyarrow.parquet as pq

    run_dir = tmp_path / "run"
    proc = run_tiny_grpo(run_dir, "grpo.steps_per_generation=2", "grpo.eval_every=0")
    assert sorted(p.name for p in (run_dir / "rollouts").iterdir()) == ["step_000000.parquet"]
    rollouts = pq.read_table(run_dir / "rollouts" / "step_000000.parquet").to_pylist()
    assert len(rollouts) == 16 and len({r["adapter_id"] for r in rollouts}) == 1
    metrics = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    assert [r["step"] for r in metrics] == [1, 2]
    assert metrics[0]["rollouts"] == 16 and metrics[0]["rollouts_per_s"] > 0
    assert math.isnan(metrics[1]["rollouts"]) and math.isfinite(metrics[1]["loss"])
    assert "rollouts of the last generation batch" in proc.stderr + proc.stdout


def test_auto_micro_batch_bounds_the_training_pass():
    # grpo.micro_batch_size=null: one pass over 64 rollouts needed ~19 GB on CPU (killed for memory)
    from engine.commands.grpo_config import auto_micro_batch
    assert auto_micro_batch(64) == 16
    assert auto_micro_batch(32) == 16
    assert auto_micro_batch(8) == 8
    assert auto_micro_batch(24) == 12
    assert auto_micro_batch(7) == 7
    assert auto_micro_batch(34) == 2  # 34 = 2 x 17: the largest divisor <= 16
    for n in range(1, 200):
        m = auto_micro_batch(n)
        assert 1 <= m <= 16 and n % m == 0
