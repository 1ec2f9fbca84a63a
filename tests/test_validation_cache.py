"""The baseline cache (engine/evaluation/validation.py ``cached_rewards``): the base model's held-out
rewards are scored once per model, dtype, problems and decoding, and read back after."""
from __future__ import annotations

import numpy as np

from engine.evaluation.validation import cached_rewards


def test_scored_once_then_read_back_and_keyed_by_every_field(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"no_adapter": np.array([1.0, 0.0, np.nan])}

    key = {"model": "m", "dtype": "bfloat16", "problems": [["p0", "q", "1"]], "max_tokens": 96}
    first, hit1 = cached_rewards(tmp_path, key, compute)
    again, hit2 = cached_rewards(tmp_path, dict(key), compute)
    assert (hit1, hit2) == (False, True) and len(calls) == 1
    np.testing.assert_array_equal(first["no_adapter"], again["no_adapter"])  # NaN (unscorable) survives
    _, hit3 = cached_rewards(tmp_path, {**key, "dtype": "float32"}, compute)
    assert not hit3 and len(calls) == 2


def test_a_damaged_cache_file_is_recomputed(tmp_path):
    key = {"model": "m"}
    cached_rewards(tmp_path, key, lambda: {"no_adapter": np.zeros(2)})
    (f,) = tmp_path.glob("*.json")
    f.write_text("{not json")
    rewards, hit = cached_rewards(tmp_path, key, lambda: {"no_adapter": np.ones(2)})
    assert not hit and rewards["no_adapter"].tolist() == [1.0, 1.0]


def test_look_up_only_reads_a_hit_and_writes_nothing_on_a_miss(tmp_path):
    """A compute that returns None (essa train under deadline_s, before the generations) only looks up."""
    key = {"model": "m"}
    assert cached_rewards(tmp_path, key, lambda: None) == (None, False)
    assert not list(tmp_path.glob("*.json"))
    cached_rewards(tmp_path, key, lambda: {"no_adapter": np.ones(2)})
    rewards, hit = cached_rewards(tmp_path, key, lambda: None)
    assert hit and rewards["no_adapter"].tolist() == [1.0, 1.0]


def test_a_cached_value_that_is_not_a_dict_is_a_miss(tmp_path):
    """A damaged file whose value is null (or a list) is recomputed, not returned as a hit."""
    import json

    key = {"model": "m"}
    cached_rewards(tmp_path, key, lambda: {"no_adapter": np.zeros(2)})
    (f,) = tmp_path.glob("*.json")
    for bad in (None, []):
        f.write_text(json.dumps({"key": key, "value": bad}))
        rewards, hit = cached_rewards(tmp_path, key, lambda: {"no_adapter": np.ones(2)})
        assert not hit and rewards["no_adapter"].tolist() == [1.0, 1.0]


def test_validation_log_replaces_a_step_and_condition_logged_again(tmp_path):
    """A resumed run redoing an interrupted final call must not count its problems twice."""
    from engine.results.run_files import ValidationLog
    from engine.tasks import Problem

    problems = [Problem(f"t/val/{i}", "q", "1") for i in range(4)]
    log = ValidationLog(tmp_path, "essa", problems, lambda: 1.0)
    log.add(2, {"sft": np.array([1.0, 0.0, 0.0, 0.0]), "mean": np.array([1.0, 1.0, 0.0, 0.0])})
    again = ValidationLog(tmp_path, "essa", problems, lambda: 2.0)  # the resumed run reads the files back
    again.add(2, {"sft": np.array([1.0, 0.0, 0.0, 0.0]), "mean": np.array([1.0, 1.0, 1.0, 0.0])})
    again.add(0, {"no_adapter": np.zeros(4)})
    assert sorted((r["step"], r["condition"]) for r in again.rows) == [(0, "no_adapter"), (2, "mean"), (2, "sft")]
    assert len(again.problem_rows) == 12
    s = again.summary()
    assert s["accuracy"]["mean"] == 0.75 and s["paired"]["mean"]["n"] == 4
