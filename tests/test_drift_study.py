"""tools/drift_study.py on a small synthetic eval directory (the files essa eval writes)."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tools.drift_study import main


def _eval_dir(d, task, correct: dict, drift: dict | None = None):
    d.mkdir()
    conds = {c: {"greedy_accuracy": float(np.mean(v))} for c, v in correct.items()}
    (d / "eval_summary.json").write_text(json.dumps({"task": task, "conditions": conds}))
    rows = [{"condition": c, "problem_id": f"p{i}", "greedy_correct": float(x)} for c, v in correct.items() for i, x in enumerate(v)]
    pq.write_table(pa.Table.from_pylist(rows), d / "eval_problems.parquet")
    if drift is not None:
        (d / "eval_drift.json").write_text(json.dumps(drift))
    return d


def test_table_pairs_against_the_control_and_between_methods_of_a_seed(tmp_path, capsys):
    n = 40
    sft = [1] * 10 + [0] * 30
    correct = {"sft": sft, "essa_s0": [1] * 20 + [0] * 20, "grpo_s0": [1] * 12 + [0] * 28}
    kl = lambda v: {"kl_token": v, "kl_prompt": v}
    drift = {"warm_start": {"arithmetic": {"sft": kl(0.0), "essa_s0": kl(0.02), "grpo_s0": kl(0.01)},
                            "svamp": {"sft": kl(0.0), "essa_s0": kl(0.05), "grpo_s0": kl(0.03)}}}
    ev = _eval_dir(tmp_path / "ev", "arithmetic", correct, drift)
    other = _eval_dir(tmp_path / "sv", "svamp", {"sft": [1] * 4 + [0] * 36, "essa_s0": [1] * 6 + [0] * 34})
    main([str(ev), "--accuracy", str(other)])
    out = capsys.readouterr().out
    essa_row = next(l for l in out.splitlines() if l.startswith("| essa_s0 "))
    # 10 problems only essa solves, none only sft: +25 points, McNemar p = 2 * 0.5**10
    assert "+25.0 [" in essa_row and "p 0.002" in essa_row and "| 0.0200 | 0.0500 | 0.150 |" in essa_row
    assert out.splitlines()[4].startswith("| sft | 0.250 | - |") and "| grpo_s0 | 0.300 | +5.0 [" in out
    assert "- seed 0: essa_s0 - grpo_s0: +20.0 [" in out
    assert (ev / "drift_study.png").stat().st_size > 1000 and (ev / "drift_study.md").read_text().startswith("KL against `warm_start`")


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    import pytest

    kl = {"kl_token": 0.01, "kl_prompt": 0.01}
    good = {"sft": [1, 0, 0, 1], "essa_s0": [1, 1, 0, 1]}
    drift = {"warm_start": {"svamp": {"sft": kl, "essa_s0": kl}}}
    ev = _eval_dir(tmp_path / "ev", "arithmetic", good, drift)
    cases = {
        "missing": ([str(tmp_path / "nope")], "eval_summary.json: missing"),
        "control": ([str(ev), "--control", "base"], "--control base: not a condition"),
        "reference": ([str(ev), "--reference", "base"], "--reference base: no drift results"),
        "out": ([str(ev), "--out", str(ev / "eval_summary.json")], "cannot write there"),
        "accuracy twice": ([str(ev), "--accuracy", str(ev)], "is given twice (or is the eval's own task)"),
    }
    for name, (argv, expect) in cases.items():
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert str(e.value).startswith("drift_study: error:") and expect in str(e.value) and "\n" not in str(e.value), name
    (ev / "eval_drift.json").write_text("{")
    with pytest.raises(SystemExit, match="not valid JSON"):
        main([str(ev)])
    short = _eval_dir(tmp_path / "short", "arithmetic", {"sft": [1, 0, 0, 1], "essa_s0": [1]}, drift)
    with pytest.raises(SystemExit, match="essa_s0 did not score 3 of sft's problems"):
        main([str(short)])
    assert not list(tmp_path.rglob("drift_study.*")) and not list(tmp_path.rglob(".*tmp*"))
