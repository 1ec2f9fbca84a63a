"""In float32 the same adapter gives the same greedy answers in two separate engines (issue 37 item 4).

This is what lets ``essa train`` reuse the warm start's held-out rewards from an earlier run in float32
(engine/commands/train.py ``cached_warm_start``) instead of scoring it in every final call. Real engine,
default model, ``essa train``'s configuration in float32 (prefix caching as the run has it), 20 GSM8K
test problems, 96 greedy tokens: engine 1 scores the adapter beside another adapter (as in a final call
with the exports), is closed, and engine 2 (a new process) scores it alone. Texts and rewards must be
equal. The adapter is a random LoRA of the warm start's shape (the test does not train one); in bf16
answers drift between calls, so there the warm start stays in the final call (not tested here).
"""
from __future__ import annotations

import pytest

from engine.backends import AdapterRef, Sampling, lora_int_id
from engine.tasks import default_data_root

GSM8K = default_data_root() / "gsm8k" / "test.jsonl"
N_PROMPTS, MAX_TOKENS = 20, 96


def _score(setup, adapters):
    """(texts, rewards) of ``adapters[0]`` on the problems, from a freshly started engine closed afterwards."""
    from tests.helpers import train_evaluator

    s = setup
    ev = train_evaluator(s["cfg"], s["model"], None, s["meta"], s["tokenizer"])
    try:
        rewards, outs, *_ = ev.score(adapters, s["problems"], Sampling(max_tokens=MAX_TOKENS, temperature=0.0, n=1,
                                                                      seed=0), use_tqdm=False)
    finally:
        ev.close()
    return [o[0].text for o in outs[0]], rewards[0, :, 0].tolist()


@pytest.mark.slow  # a numerics study (issue 42); make test-all
@pytest.mark.integration
@pytest.mark.timeout(1200)
def test_float32_same_answers_in_two_separate_engines(tmp_path):
    if not GSM8K.exists():
        pytest.skip(f"{GSM8K} missing (set ESSA_DATA)")
    from hydra import compose, initialize_config_dir
    from transformers import AutoConfig, AutoTokenizer

    from engine.commands import register_configs
    from engine.config import CONF_DIR
    from engine.lora.files import AdapterMeta, write_adapter
    from engine.model import resolve_model_path
    from engine.tasks import load_task
    from tests.helpers import random_lora

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["task=gsm8k", f"task.val_size={N_PROMPTS}", "model.dtype=float32",
                                                      "engine.kv_cache_gib=1", "strategy.population_size=2"])
    model = resolve_model_path(cfg.model.path)
    config, alpha = AutoConfig.from_pretrained(model), 2.0 * cfg.lora.rank
    warm, other = (write_adapter(tmp_path / f"a{s}", random_lora(config, seed=s, std=0.02), cfg.lora.rank, alpha, model)
                   for s in (0, 1))
    setup = dict(cfg=cfg, model=model, tokenizer=AutoTokenizer.from_pretrained(model),
                 problems=load_task(cfg.task).val[:N_PROMPTS],
                 meta=AdapterMeta(cfg.lora.rank, alpha, tuple(cfg.lora.target_modules), model))
    ref = lambda name, k, path: AdapterRef(name, lora_int_id(-1, 100 + k), str(path))  # noqa: E731
    texts_1, rewards_1 = _score(setup, [ref("sft", 0, warm), ref("mean", 1, other)])
    texts_2, rewards_2 = _score(setup, [ref("sft", 0, warm)])
    assert all(texts_1), "empty completions: the engine did not generate"
    differ = [n for n in range(N_PROMPTS) if texts_1[n] != texts_2[n]]
    assert not differ and rewards_1 == rewards_2, f"float32: other answers in a second engine on problems {differ}"
