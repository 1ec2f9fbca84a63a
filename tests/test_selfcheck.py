"""The start-up self-check of LoRA on a quantized base (engine/evaluation/selfcheck.py, issue 29 item 4).

An engine stand-in scores the fixed answer from the adapter files the check writes, so the check is
exercised end to end without vLLM: when it applies adapters (B A x moves the log-probabilities) the
check passes; when it cannot change the output (adapters ignored, as in vllm issues 9120 and 42488)
or when a zero adapter changes it, the run stops with one line naming ``model.quantization``. The
probe adapters themselves are checked on the real float model with transformers + peft. The check on
a real quantized engine: tests/test_quantization.py::test_lora_on_quantized_base (integration).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.evaluation import selfcheck
from engine.lora.files import AdapterMeta, read_adapter


class Tokenizer:
    """Characters as tokens; a plain chat template."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


class Engine:
    """``prompt_logprobs`` as an engine that applies each adapter's weights (``applies``) or ignores them;
    ``zero_leaks`` makes even a B = 0 adapter move the output."""

    def __init__(self, applies: bool = True, zero_leaks: bool = False):
        self.tokenizer, self.applies, self.zero_leaks = Tokenizer(), applies, zero_leaks
        self.calls, self.closed, self.max_loras = [], False, 4

    def prompt_logprobs(self, token_ids, adapters, use_tqdm=False):
        self.calls.append([None if a is None else a.lora_int_id for a in adapters])
        assert len({a.lora_int_id for a in adapters if a is not None}) == 2  # the two probes, distinct ids
        out = []
        for ids, a in zip(token_ids, adapters):
            lp = -0.5 - 0.01 * (np.arange(len(ids) - 1) % 7)  # the "base model"
            if a is not None and self.applies:
                lora, cfg = read_adapter(a.path)  # the engine reads the files the check wrote
                b = float(np.mean([v.abs().mean().item() for k, v in lora.items() if ".lora_B." in k]))
                lp = lp - 10 * b * cfg["lora_alpha"] / cfg["r"] - (0.3 if self.zero_leaks else 0.0)
            out.append(list(lp))
        return out

    def close(self):
        self.closed = True


def template():
    from strategies.genomes import random_lora

    return random_lora(num_layers=2)


def test_passes_when_the_engine_applies_adapters(tmp_path):
    res = selfcheck.check_lora_serving(Engine(), "int4", template(), 8, 16.0, "base", tmp_path)
    assert res.ok and res.zero_max == 0.0 and res.moved_mean >= selfcheck.MOVE_MIN_NATS
    assert res.tokens == len(selfcheck.ANSWER)  # the answer's tokens are scored, not the prompt's
    assert list(tmp_path.iterdir()) == []       # the probe adapters are removed


@pytest.mark.parametrize("engine, why", [
    (Engine(applies=False), "moved log-probabilities by 0 nats/token"),   # LoRA silently not applied
    (Engine(zero_leaks=True), "one with B = 0 by up to 0.3"),              # a zero adapter changes the output
])
def test_stops_in_one_line_when_lora_is_not_applied(tmp_path, engine, why):
    with pytest.raises(ValueError) as e:
        selfcheck.check_lora_serving(engine, "int4", template(), 8, 16.0, "base", tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("model.quantization=int4: LoRA self-check failed on the quantized base")
    assert why in msg and msg.endswith("use model.quantization=null (the float base)")
    assert list(tmp_path.iterdir()) == []


class Evaluator:
    def __init__(self, backend, root):
        from strategies.genomes import SVDLoRAGenome

        self.backend, self.root, self.closed = backend, root, False
        self.codec = SVDLoRAGenome(template())
        self.meta = AdapterMeta(8, 16.0, ("q_proj", "k_proj", "v_proj", "o_proj"), "base")

    def close(self):
        self.closed = True


def test_selfchecked_runs_only_for_a_quantized_base_and_closes_on_failure(tmp_path):
    ok = Evaluator(Engine(), tmp_path)
    assert selfcheck.selfchecked(ok, None) is ok and ok.backend.calls == []     # float base: nothing run
    assert selfcheck.selfchecked(ok, "int8") is ok and len(ok.backend.calls) == 1
    bad = Evaluator(Engine(applies=False), tmp_path)
    with pytest.raises(ValueError, match=r"^model\.quantization=int8: LoRA self-check failed"):
        selfcheck.selfchecked(bad, "int8")
    assert bad.closed and bad.backend.closed                                    # no engine left running


def test_a_ray_evaluator_is_not_checked_but_says_so(tmp_path, caplog):
    ray_like = Evaluator(None, tmp_path)
    assert selfcheck.selfchecked(ray_like, "int4") is ray_like
    assert any("local engines only" in r.getMessage() for r in caplog.records)


def test_build_evaluator_stops_a_quantized_run_in_one_line(tmp_path, monkeypatch, capsys):
    """``build_evaluator`` (essa train's) on a quantized base whose engine ignores adapters: the one-line
    stop the CLI prints (``essa: error: ...``, exit 2), the engine closed, no adapter directory left."""
    import engine.backends.vllm_local as vllm_local
    from engine.cli.hydra_app import fail
    from engine.config import EngineConfig, ModelConfig
    from engine.evaluation.build import build_evaluator
    from strategies.genomes import SVDLoRAGenome

    engines = []
    monkeypatch.setattr(vllm_local, "VLLMBackend", lambda *a, **k: engines.append(Engine(applies=False)) or engines[-1])
    meta = AdapterMeta(8, 16.0, ("q_proj", "k_proj", "v_proj", "o_proj"), "base")
    with pytest.raises(ValueError) as e:
        build_evaluator(EngineConfig(adapter_dir=str(tmp_path)), ModelConfig(quantization="int4"), "served",
                        SVDLoRAGenome(template()), meta, Tokenizer(), None, "", 0, adapters_per_batch=4)
    assert engines[0].closed and list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit) as code:
        fail(e.value)
    assert code.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("essa: error: model.quantization=int4: LoRA self-check failed"), err


def test_the_moving_probe_moves_the_real_model_and_the_zero_probe_does_not(tmp_path):
    """The probes on SmolLM2-135M (float32, transformers + peft): the moving adapter shifts the answer's
    log-probabilities by nats (3.2 per token measured), far above MOVE_MIN_NATS; B = 0 changes nothing."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.evaluation.prefill import encode_pairs
    from engine.lora.files import write_adapter
    from engine.model import resolve_model_path
    from engine.prompts import build_prompt
    from tests.helpers import hf_target_logprobs

    path = resolve_model_path("embedded:smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(path)
    pairs = encode_pairs(tok, [build_prompt(tok, selfcheck.QUESTION, selfcheck.SYSTEM_PROMPT)], [selfcheck.ANSWER])
    base = hf_target_logprobs(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), pairs)[0]
    zero, moving = selfcheck.probe_loras(selfcheck.model_lora_template(path, 8))
    moved = {}
    for name, lora in (("zero", zero), ("moving", moving)):
        d = write_adapter(tmp_path / name, lora, 8, 16.0, path)
        assert json.loads((Path(d) / "adapter_config.json").read_text())["r"] == 8
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), str(d))
        moved[name] = np.abs(hf_target_logprobs(model, pairs)[0] - base)
    assert moved["zero"].max() == 0.0
    assert moved["moving"].mean() > 5 * selfcheck.MOVE_MIN_NATS
