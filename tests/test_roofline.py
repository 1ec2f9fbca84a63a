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
