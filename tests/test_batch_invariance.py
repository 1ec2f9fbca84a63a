"""The same adapter gives the same greedy answers wherever it sits in the batch (issue 42).

ESSA ranks candidates by small fitness differences (ESSA §3.3), so a candidate's verdicts must follow
its weights, not its batch slot or its neighbours. Real engine, default model, ``essa train``'s own
configuration with ``engine.numerics=invariant`` (``model.dtype: auto``, so the default dtype of the CPU
class the test runs on, prefix caching as the run has it, 96 greedy tokens), six GSM8K test problems:

1. one call of eight adapters: the same adapter under two ids in slots 1 and 6 (byte-identical
   files), six others around them (random LoRA factors of other seeds);
2. each problem alone: the same adapter under a third id, a batch of one request.

Every problem's completion must be the same text in both slots and alone. On the AMX Xeon in bf16
(oneDNN picks its GEMM kernel by the batch's row count) the copies disagreed on up to half of the
prompts; ``engine.numerics=invariant`` serves the population with kernels that do not change with the
batch there (engine/hardware.py ``resolve_numerics``); on the other classes the default kernels already do.
"""
from __future__ import annotations

import pytest

from engine.backends import AdapterRef, Sampling, lora_int_id
from engine.tasks import default_data_root

GSM8K = default_data_root() / "gsm8k" / "test.jsonl"
N_PROMPTS, MAX_TOKENS, OTHERS = 6, 96, 6


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The default train config (eight GSM8K problems), the model, its tokenizer and the adapters on disk."""
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
        cfg = compose(config_name="train", overrides=["task=gsm8k", f"task.val_size={N_PROMPTS}",
                                                      "engine.kv_cache_gib=1", f"strategy.population_size={OTHERS + 1}",
                                                      "engine.numerics=invariant"])
    model = resolve_model_path(cfg.model.path)
    config = AutoConfig.from_pretrained(model)
    alpha = 2.0 * cfg.lora.rank
    root = tmp_path_factory.mktemp("adapters")
    paths = [write_adapter(root / f"a{s}", random_lora(config, seed=s, std=0.02), cfg.lora.rank, alpha, model)
             for s in range(OTHERS + 1)]
    return dict(cfg=cfg, model=model, tokenizer=AutoTokenizer.from_pretrained(model), paths=paths,
                problems=load_task(cfg.task).val[:N_PROMPTS],
                meta=AdapterMeta(cfg.lora.rank, alpha, tuple(cfg.lora.target_modules), model))


@pytest.mark.integration
@pytest.mark.timeout(1500)
def test_same_adapter_same_answers_in_any_slot_and_alone(setup):
    from tests.helpers import train_evaluator

    s = setup
    ref = lambda name, k, path: AdapterRef(name, lora_int_id(-2, k), str(path))  # noqa: E731
    others = [ref(f"other{k}", k, p) for k, p in enumerate(s["paths"][1:], start=1)]
    twin_a, twin_b, alone = (ref(n, 100 + k, s["paths"][0]) for k, n in enumerate(("twin_a", "twin_b", "alone")))
    batch = others[:1] + [twin_a] + others[1:5] + [twin_b] + others[5:]  # twins in slots 1 and 6
    sampling = Sampling(max_tokens=MAX_TOKENS, temperature=0.0, n=1, seed=0)
    ev = train_evaluator(s["cfg"], s["model"], None, s["meta"], s["tokenizer"])
    try:
        _, full, *_ = ev.score(batch, s["problems"], sampling, use_tqdm=False)
        single = [ev.score([alone], [p], sampling, use_tqdm=False)[1][0][0][0].text for p in s["problems"]]
    finally:
        ev.close()
    a, b = ([out[0].text for out in full[k]] for k in (1, 6))
    assert all(a), "empty completions: the engine did not generate"
    assert sum(x != y for x, y in zip(a, [out[0].text for out in full[0]])) >= N_PROMPTS // 2, \
        "the other adapters write what the twin writes: the batch would test nothing"
    slots = [n for n in range(N_PROMPTS) if a[n] != b[n]]
    solo = [n for n in range(N_PROMPTS) if a[n] != single[n]]
    assert not slots and not solo, (f"dtype {s['cfg'].model.dtype}: the same adapter wrote other text in another "
                                    f"slot on problems {slots} and alone on problems {solo}")
