"""tools/scaling_model.py: ESSA's Appendix B latency model (pure arithmetic, milliseconds)."""
from __future__ import annotations

import dataclasses
import math

import pytest

from tools.scaling_model import (DEFAULT_GPUS, ScalingInputs, crossover_gpus, essa_comm_coeff, essa_compute,
                                 essa_step_seconds, fwd_bwd_seconds, gen_seconds, main, rl_comm_coeff, rl_compute,
                                 rl_step_seconds, table)

DEFAULT = ScalingInputs()


def test_hand_computed_defaults():
    # Qwen2.5-32B, H100, 400 Gb/s: numbers worked out by hand from the module docstring's formulas
    assert gen_seconds(DEFAULT) == pytest.approx(512 / 1500)
    assert fwd_bwd_seconds(DEFAULT) == pytest.approx(3 * 2 * 32.5e9 * 768 / (989e12 * 0.4))
    assert rl_comm_coeff(DEFAULT) == pytest.approx(2 * 32.5e9 * 2 / 50e9)  # 2.6 s: the whole model twice
    assert essa_comm_coeff(DEFAULT) == pytest.approx(8 * 96 / 50e9)  # 768 bytes
    assert essa_step_seconds(DEFAULT, 8) == pytest.approx(96 * 100 * 512 / 1500 / 8 + 8 * 96 * 7 / 8 / 50e9)
    assert rl_step_seconds(DEFAULT, 1) == pytest.approx(rl_compute(DEFAULT))  # no communication on one GPU


def test_essa_scales_linearly_and_rl_saturates_at_its_communication_floor():
    e8, e1024 = essa_step_seconds(DEFAULT, 8), essa_step_seconds(DEFAULT, 1024)
    assert e8 / e1024 == pytest.approx(128, rel=1e-6)  # 8 bytes per candidate cost nothing
    floor = rl_comm_coeff(DEFAULT)
    for w in DEFAULT_GPUS:
        assert rl_step_seconds(DEFAULT, w) > floor * (w - 1) / w
    assert rl_step_seconds(DEFAULT, 1e9) == pytest.approx(floor, rel=1e-5)


@pytest.mark.parametrize("inp", [
    DEFAULT,                                                  # crossover near 1000 GPUs
    ScalingInputs(bandwidth_gbps=100),                        # slower links: RL saturates earlier
    ScalingInputs(params=72e9, gen_tokens_per_s=700),         # larger model
    ScalingInputs(population=24, prompts=100, rl_sequences=512),
])
def test_crossover_is_where_the_step_times_meet(inp):
    w = crossover_gpus(inp)
    assert w == pytest.approx(1 + (essa_compute(inp) - rl_compute(inp)) / (rl_comm_coeff(inp) - essa_comm_coeff(inp)))
    assert essa_step_seconds(inp, w) == pytest.approx(rl_step_seconds(inp, w), rel=1e-9)
    assert essa_step_seconds(inp, 0.9 * w) > rl_step_seconds(inp, 0.9 * w)  # before: RL's step is faster
    assert essa_step_seconds(inp, 1.1 * w) < rl_step_seconds(inp, 1.1 * w)  # after: ESSA's is


def test_crossover_moves_as_the_formula_says():
    # W* - 1 is proportional to bandwidth (ESSA's 8-byte all-gather aside) ...
    base = crossover_gpus(ScalingInputs(bandwidth_gbps=100))
    assert crossover_gpus(ScalingInputs(bandwidth_gbps=200)) - 1 == pytest.approx(2 * (base - 1), rel=1e-6)
    # ... and to ESSA's extra compute: a bigger population pushes it out
    d0 = crossover_gpus(DEFAULT) - 1
    bigger = ScalingInputs(population=192)
    extra = (essa_compute(bigger) - rl_compute(bigger)) / (essa_compute(DEFAULT) - rl_compute(DEFAULT))
    assert crossover_gpus(bigger) - 1 == pytest.approx(extra * d0, rel=1e-6)
    # a model-size sweep with generation throughput ~ 1/params scales every term: W* stays put
    big = ScalingInputs(params=65e9, gen_tokens_per_s=750)
    assert crossover_gpus(big) == pytest.approx(crossover_gpus(DEFAULT), rel=1e-6)


def test_no_crossover_cases():
    cheap_essa = ScalingInputs(population=8, prompts=16)  # ESSA's step needs less compute: faster everywhere
    assert crossover_gpus(cheap_essa) == 1.0
    assert all(r["essa_advantage"] > 1 for r in table(cheap_essa))
    # RL moving fewer bytes than ESSA's all-gather (absurd, but the formula must not divide by <= 0)
    assert crossover_gpus(ScalingInputs(params=1, bytes_per_param=1)) == math.inf


def test_table_rows():
    rows = table(DEFAULT)
    assert [r["gpus"] for r in rows] == list(DEFAULT_GPUS)
    assert rows[0]["essa_speedup"] == rows[0]["rl_speedup"] == 1.0
    assert rows[-1]["essa_speedup"] == pytest.approx(128, rel=1e-6)
    assert rows[-1]["rl_speedup"] < 64  # communication-bound
    # ESSA's advantage grows with GPU count, and rl_steps_per_essa_step multiplies it
    adv = [r["essa_advantage"] for r in rows]
    assert adv == sorted(adv)
    rows4 = table(dataclasses.replace(DEFAULT, rl_steps_per_essa_step=4))
    assert rows4[1]["essa_advantage"] == pytest.approx(4 * rows[1]["essa_advantage"])


@pytest.mark.parametrize("field,value", [("params", 0), ("mfu", 1.5), ("bandwidth_gbps", -1),
                                         ("gen_tokens_per_s", float("nan")), ("population", 0)])
def test_bad_inputs_name_the_flag(field, value):
    with pytest.raises(ValueError, match=field):
        ScalingInputs(**{field: value})


def test_cli_prints_a_table_per_setting(capsys):
    assert main(["--params-b", "7", "32.5", "--bandwidth-gbps", "100", "400"]) == 0
    out = capsys.readouterr().out
    assert out.count("crossover W*") == 4 and out.count("\n  1024 ") == 4
    assert "params 32.5B" in out and "bandwidth 100 Gb/s" in out
    assert main(["--gpus", "0"]) == 2
    assert "need at least 1 GPU" in capsys.readouterr().err
