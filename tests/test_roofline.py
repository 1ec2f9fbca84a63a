"""The GEMM roofline (engine/evaluation/roofline.py): FLOP counts, the fraction, a measured rate."""
from __future__ import annotations

import math

import pytest

from engine.evaluation.roofline import (ModelShapes, gemm_rate, generation_flops, limit_tokens_per_s,
                                        roofline_fraction)

FAKE = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 10}


def test_shapes_from_config_count_every_layer_gemm():
    s = ModelShapes.from_config(FAKE)
    assert (s.head_dim, s.kv_heads) == (2, 2)
    # per layer: q 8x8, k 8x4, v 8x4, o 8x8, gate/up 8x16 each, down 16x8
    assert s.layer_params == 2 * (64 + 32 + 32 + 64 + 128 + 128 + 128)
    assert s.gemms()["lm_head"] == (8, 10)


def test_generation_flops_exact():
    s = ModelShapes.from_config(FAKE)  # layer_params 1152
    assert generation_flops(s, prompt_tokens=3, completion_tokens=2) == 2 * 1152 * 5 + 2 * 8 * 10 * 2


def test_missing_config_field_is_named():
    with pytest.raises(KeyError, match="intermediate_size"):
        ModelShapes.from_config({k: v for k, v in FAKE.items() if k != "intermediate_size"})


def test_fraction_arithmetic():
    assert roofline_fraction(4e9, 2.0, 4.0) == pytest.approx(0.5)  # 2 GFLOP/s achieved of 4
    assert math.isnan(roofline_fraction(1e9, 0.0, 4.0))
    assert math.isnan(roofline_fraction(1e9, 1.0, float("nan")))
    s = ModelShapes.from_config(FAKE)
    # at the limit, the call's FLOPs take flops / rate seconds
    f = generation_flops(s, 30, 10)
    assert limit_tokens_per_s(s, 1.0, 30, 10) == pytest.approx(10 / (f / 1e9))


def test_measured_rate_positive_and_finite_on_a_tiny_shape():
    r = gemm_rate(ModelShapes.from_config(FAKE), rows=4, dtype="float32", seconds=0.05)
    assert r["gflops"] > 0 and math.isfinite(r["gflops"])
    assert r["threads"] >= 1 and r["rows"] == 4


@pytest.mark.parametrize("rows,dtype", [(0, "float32"), (4, "float33")])
def test_bad_arguments_refused(rows, dtype):
    with pytest.raises(ValueError, match="roofline"):
        gemm_rate(ModelShapes.from_config(FAKE), rows=rows, dtype=dtype, seconds=0.01)


def test_bench_records_and_prints_the_roofline(tmp_path):
    """essa bench: one measured rate in bench.json's "roofline", a fraction per run, a line in the table."""
    import json

    from omegaconf import OmegaConf

    from engine.commands.bench import Bench, format_table, roofline

    (tmp_path / "config.json").write_text(json.dumps(FAKE))
    b = Bench(OmegaConf.create({"engine": {"max_num_seqs": 3}}), [2], 2, 4, 2)
    b.float_model, b.dtype = str(tmp_path), "float32"
    run = {"tokens": 10, "prompt_tokens": 30, "seconds": 1.0, "tokens_per_s": 10.0}
    b.result = {"settings": {"model": "m", "prompts_per_candidate": 2, "max_tokens": 4, "rank": 8, "fast_lora": True},
                "machine": {"cpu": "c", "cores": 2, "vllm": "v", "torch": "t"}, "notes": [],
                "rows": [{"P": 2, "sequences": 4, "base": dict(run), "population": dict(run), "ratio_pop_base": 1.0}]}
    roofline(b, seconds=0.02)
    r = b.result["roofline"]
    assert r["rows"] == 3 and r["dtype"] == "float32" and r["gflops"] > 0  # M capped by engine.max_num_seqs
    flops = generation_flops(ModelShapes.from_config(FAKE), 30, 10)
    fraction = b.result["rows"][0]["base"]["roofline_fraction"]  # stored to 4 places
    assert fraction == pytest.approx(flops / 1e9 / r["gflops"], abs=1e-4)
    assert "of the GEMM limit" in format_table(b.result) and "P=2: base at" in format_table(b.result)


def test_train_generation_row_has_the_roofline_fraction():
    import numpy as np

    from engine.commands.train import generation_row
    from engine.evaluation.population import EvalResult

    P, N = 2, 2
    rows = {"candidate": [0, 0, 1, 1], "completion": ["a", "b", "a", "b"], "status": ["ok"] * 4}
    result = EvalResult(np.array([0.5, 0.5]), np.full((P, N, 1), 0.5), rows, {"generate": 2.0}, 8)
    assert np.isnan(generation_row(0, 1.0, result, P, 0.1, 0.0, 0.0)["roofline_fraction"])
    assert generation_row(0, 1.0, result, P, 0.1, 0.0, 0.0, roofline=0.25)["roofline_fraction"] == 0.25


def test_gemm_limit_fraction_is_flops_over_rate():
    from engine.evaluation.roofline import GemmLimit

    s = ModelShapes.from_config(FAKE)
    limit = GemmLimit(s, gflops=2.0)
    assert limit.fraction(30, 10, 0.5) == pytest.approx(generation_flops(s, 30, 10) / 0.5 / 2e9)
    assert GemmLimit.measure(s, rows=2, dtype="float32", seconds=0.02).gflops > 0


def test_train_measures_once_and_prices_a_generation(tmp_path):
    """essa train: the limit at M = the generation's requests capped by engine.max_num_seqs, in the run's
    dtype; a generation's fraction counts every request's prompt tokens and the completion tokens."""
    import json
    import types

    import numpy as np
    from omegaconf import OmegaConf

    from engine.commands import train
    from engine.commands.train_checkpoint import RunState
    from engine.evaluation.population import EvalResult
    from engine.evaluation.roofline import GemmLimit
    from engine.tasks import Problem

    (tmp_path / "config.json").write_text(json.dumps(FAKE))
    cfg = OmegaConf.create({"engine": {"max_num_seqs": 5}, "rollout": {"fitness": "reward", "prompts_per_generation": 4},
                            "task": {"system_prompt": "s"}})
    run = types.SimpleNamespace(cfg=cfg, model_path=str(tmp_path), dtype=("float32", "test"), state=RunState(), P=2,
                                tokenizer=None)
    limit = train.measure_gemm_limit(run, seconds=0.02)
    assert limit.gflops > 0 and limit.shapes == ModelShapes.from_config(FAKE)

    class Tok:  # one token per character of the chat-templated prompt
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return "".join(m["content"] for m in messages)

        def __call__(self, texts, add_special_tokens):
            return {"input_ids": [list(t) for t in texts]}

    run.tokenizer, run.gemm_limit = Tok(), GemmLimit(ModelShapes.from_config(FAKE), 1.0)
    result = EvalResult(np.zeros(3), np.zeros((3, 1, 1)), {}, {"generate": 2.0}, tokens=6)
    batch = [Problem("a", "qq", "1")]
    per_prompt = len(Tok().apply_chat_template([{"content": "s"}, {"content": "qq"}], False, True))
    got = train.generation_roofline(run, result, batch, adapters=3)
    assert got == pytest.approx(generation_flops(ModelShapes.from_config(FAKE), 3 * per_prompt, 6) / 2.0 / 1e9)
