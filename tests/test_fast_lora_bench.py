"""``essa bench`` (engine/commands/bench.py): config, inputs, report; one tiny end-to-end run (integration)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parent.parent
GSM8K = Path(os.environ.get("ESSA_DATA", REPO.parent / "shared" / "data")) / "gsm8k" / "test.jsonl"


def test_bench_config_has_the_documented_defaults():
    cfg = OmegaConf.load(REPO / "conf" / "bench.yaml")
    assert cfg.model.path == "embedded:smollm2-135m-instruct"
    assert list(cfg.populations) == [4, 16, 48]
    assert cfg.prompts_per_candidate == 16 and cfg.max_tokens == 96 and cfg.lora.rank == 8
    assert cfg.naive.enabled is True and cfg.engine.fast_lora is True and cfg.phases_population == 16


@pytest.mark.skipif(not GSM8K.exists(), reason="GSM8K test split not present")
def test_load_questions_reads_gsm8k_answers():
    from engine.commands.bench import load_questions

    qa = load_questions(str(GSM8K), 3)
    assert len(qa) == 3 and all(q and a for q, a in qa)
    assert qa[0][1] == "18"  # Janet's ducks
    with pytest.raises(ValueError, match="prompts_per_candidate"):
        load_questions(str(GSM8K), 10**7)
    with pytest.raises(FileNotFoundError, match="bench.data"):
        load_questions("/nonexistent/gsm8k.jsonl", 1)


def test_format_table_shows_ratios_and_phases():
    from engine.commands.bench import format_table

    result = {
        "settings": {"model": "m", "prompts_per_candidate": 16, "max_tokens": 96, "rank": 8, "fast_lora": True},
        "machine": {"cpu": "cpu", "cores": 2, "vllm": "0.32.0", "torch": "2"},
        "rows": [{"P": 16, "sequences": 256, "base": {"tokens_per_s": 900.0, "seconds": 27.0},
                  "population": {"tokens_per_s": 810.0, "seconds": 30.0}, "ratio_pop_base": 0.9,
                  "naive": {"tokens_per_s": 100.0, "seconds": 240.0}, "ratio_pop_naive": 8.1}],
        "phases": {"P": 16, "phases_s": {"ask": 0.1, "decode": 0.2, "write": 0.1, "load": 0.4, "generate": 30.0,
                                         "reward": 0.05, "tell": 0.2},
                   "non_generation_s": 1.05, "generation_total_s": 30.65, "non_generation_share": 0.034, "notes": []},
        "notes": ["naive: extrapolated"],
    }
    table = format_table(result)
    assert "0.900" in table and "8.10" in table and "3.4 %" in table and "naive: extrapolated" in table


@pytest.mark.integration
@pytest.mark.timeout(1200)
def test_essa_bench_tiny_end_to_end(tmp_path):
    """`essa bench` through the CLI with a tiny budget: JSON with every section."""
    if not GSM8K.exists():
        pytest.skip("GSM8K test split not present")
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "engine.cli", "bench", "populations=[2]", "phases_population=2",
           "prompts_per_candidate=2", "max_tokens=8", "naive.candidates=1", "engine.kv_cache_gib=1",
           f"output={out}", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1100)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    res = json.loads(out.read_text())
    row = res["rows"][0]
    assert row["P"] == 2 and row["sequences"] == 4
    assert row["base"]["tokens"] > 0 and row["population"]["tokens"] > 0 and row["naive"]["tokens"] > 0
    assert set(res["phases"]["phases_s"]) >= {"ask", "decode", "write", "load", "generate", "reward", "tell"}
    assert "pop/base" in proc.stdout


class _RecordingBackend:
    """Stands in for VLLMBackend in a unit test: answers every request and records, per LoRA id,
    every adapter file it was served with (vLLM keeps serving the first weights it saw for an id)."""

    startup_s = 0.0

    class tokenizer:  # noqa: N801 - attribute access and the call the roofline's token count makes
        @staticmethod
        def apply_chat_template(messages, tokenize=False, add_generation_prompt=True):
            return "\n".join(m["content"] for m in messages)

        def __new__(cls, texts, add_special_tokens=False):  # tokenizer(texts) -> {"input_ids": [[...], ...]}
            return {"input_ids": [t.split() for t in texts]}

    def __init__(self, *args, **kwargs):
        self.weights_by_id: dict[int, set[str]] = {}
        _RecordingBackend.last = self

    def generate(self, prompts, adapters, sampling, use_tqdm=True):
        import hashlib

        from engine.backends import Completion

        for a in adapters:
            if a is not None:  # one written file = (inode, mtime, content); adapter dirs are written atomically
                f = Path(a.path) / "adapter_model.safetensors"
                st = f.stat()
                version = f"{st.st_ino}:{st.st_mtime_ns}:{hashlib.sha256(f.read_bytes()).hexdigest()}"
                self.weights_by_id.setdefault(a.lora_int_id, set()).add(version)
        return [[Completion("so \\boxed{1}", 3)] for _ in prompts]

    def close(self):
        pass


def test_bench_never_reuses_a_lora_id_for_other_weights(tmp_path, monkeypatch):
    # issue 16: ids were lora_int_id(gi * 10 + rep, k), so repeats=11 gave P=2's 11th repeat the ids of
    # P=3's first, and vLLM served the cached adapter. Every id the run uses must name one set of weights.
    import rewards
    from engine.commands import bench
    from engine.backends import vllm_local
    from rewards import RewardResult

    monkeypatch.setattr(vllm_local, "VLLMBackend", _RecordingBackend)
    monkeypatch.setattr(vllm_local, "is_cpu_platform", lambda: True)
    monkeypatch.setattr("engine.model.resolve_model_path", lambda path: "tiny-model")
    monkeypatch.setattr(bench, "lora_shapes", lambda path: {"num_layers": 1, "hidden": 16, "kv_dim": 8})
    monkeypatch.setattr(bench, "load_questions", lambda path, n: [(f"1 + {i} - {i}?", "1") for i in range(n)])
    monkeypatch.setattr(rewards, "reward", lambda texts, refs: [RewardResult(1.0, "1", "correct") for _ in texts])
    from hydra import compose, initialize_config_dir

    from engine.commands import register_configs
    from engine.config import CONF_DIR

    register_configs()
    overrides = ["populations=[2,3]", "phases_population=2", "prompts_per_candidate=2", "max_tokens=4", "repeats=11",
                 "naive.enabled=false", f"output={tmp_path / 'bench.json'}", "lora.rank=4"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("bench", overrides=overrides)
    bench.main(cfg)
    used = _RecordingBackend.last.weights_by_id
    reused = {i: len(w) for i, w in used.items() if len(w) != 1}
    assert not reused, f"LoRA ids served with more than one adapter file: {reused}"
    # warm-up (2) + P=2 x 11 repeats + its load probe (2) + P=3 x 11 repeats + the placebo's 2 copies and its
    # alone probe (1), each a fresh id
    assert len(used) == 2 + 2 * 11 + 2 + 3 * 11 + 2 + 1
