"""The final call's warm start (issue 37 item 4): in float32 its held-out rewards are cached like the base
model's and not scored again; in bf16 it is always scored in the final call, beside the exports."""
from __future__ import annotations

import types

import numpy as np
import pytest
from omegaconf import OmegaConf

import engine.commands.train as train
from engine.backends import AdapterRef
from engine.results.run_files import ValidationLog
from engine.tasks import Problem

PROBLEMS = [Problem(f"p{i}", f"q{i}", str(i)) for i in range(3)]


class FakeEvaluator:
    """Scores each adapter by its name: sft solves p0 and p1, mean solves p1 and p2; records the calls."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def score(self, adapters, problems, sampling, *a, **k):
        self.calls.append([a.name for a in adapters])
        table = {"sft": [1.0, 1.0, 0.0], "final-mean": [0.0, 1.0, 1.0]}
        return np.array([[[x] for x in table[a.name]] for a in adapters]), None, None, None


@pytest.fixture
def make_run(tmp_path, monkeypatch):
    monkeypatch.setenv("ESSA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("engine.backends.fast_lora.plugin.vllm_version", lambda: "0.0-test")
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "adapter_model.safetensors").write_bytes(b"weights")

    def make(dtype: str, run_dir: str):
        cfg = OmegaConf.create({"engine": {"numerics": "auto", "fast_lora": True}, "task": {"system_prompt": "s"},
                                "eval": {"max_tokens": 8}, "seed": 0})
        validation = ValidationLog(tmp_path / run_dir, "essa", PROBLEMS, lambda: 0.0)
        return types.SimpleNamespace(cfg=cfg, dtype=(dtype, "test"), serve_path="m", sft_dir=sft,
                                     task=types.SimpleNamespace(val=PROBLEMS), evaluator=FakeEvaluator(),
                                     validation=validation, condition_s=None, P=2)
    return make


def conds():
    return {"sft": AdapterRef("sft", 1, "sft"), "mean": AdapterRef("final-mean", 2, "mean")}


def test_dtype_rule():
    assert train.warm_start_cacheable("float32")
    assert not train.warm_start_cacheable("bfloat16") and not train.warm_start_cacheable("float16")


def test_float32_scores_the_warm_start_once_then_reads_the_cache(make_run):
    first = make_run("float32", "run1")
    note = train.validate_final(first, 3, conds())
    assert first.evaluator.calls == [["sft", "final-mean"]] and note == train.SAME_CALL  # miss: scored, stored
    second = make_run("float32", "run2")
    note = train.validate_final(second, 3, conds())
    assert second.evaluator.calls == [["final-mean"]] and "warm-start cache" in note  # hit: not scored again
    # the paired test still pairs the cached per-problem rewards with the mean genome's on the same problems
    paired = second.validation.summary()["paired"]["mean"]
    assert paired == first.validation.summary()["paired"]["mean"]
    rows = {(r["condition"], r["problem_id"]): r["reward"] for r in second.validation.problem_rows}
    assert [rows[("sft", p.id)] for p in PROBLEMS] == [1.0, 1.0, 0.0]


def test_bf16_always_scores_the_warm_start_in_the_final_call(make_run):
    for run_dir in ("run1", "run2"):
        run = make_run("bfloat16", run_dir)
        train.validate_final(run, 3, conds())
        assert run.evaluator.calls == [["sft", "final-mean"]]


def test_another_adapter_or_dtype_misses(make_run):
    train.validate_final(make_run("float32", "run1"), 3, conds())
    (make_run("float32", "x").sft_dir / "adapter_model.safetensors").write_bytes(b"other weights")
    changed = make_run("float32", "run2")
    train.validate_final(changed, 3, conds())
    assert changed.evaluator.calls == [["sft", "final-mean"]]
