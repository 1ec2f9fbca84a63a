"""A request without an adapter is computed by the base model alone, whatever else shares its batch.

Every back-end configuration the project offers is checked: the local engine and Ray
(``engine=ray``, one actor), each with essa's fast CPU LoRA kernels and with vLLM's own kernels
(``engine.fast_lora``; on a GPU only vLLM's kernels exist, so the fast cases are skipped there and
this file is the GPU check of the same property).

Real engine, default model, four GSM8K test rows from ../shared/data, 24 greedy tokens, float32 (so
a bf16 logit tie cannot flip a token). Per configuration, one engine serves:

1. a mixed batch through the evaluator's ``score``: the four prompts without an adapter and the
   same four under one adapter (random q/k/v/o LoRA factors that change every completion), with
   ``engine.max_loras=1`` as ``essa eval`` sets it for one adapter, so the adapter sits in the last
   LoRA slot (vLLM 0.32's CPU torch ops index that slot with the no-adapter id -1);
2. the four prompts alone, no adapter in the batch.

The no-adapter completions of 1 must equal those of 2, and the adapter's must differ from them (else
the comparison says nothing).

Unit tier (no engine): the plugin's mask of vLLM's CPU ops on a wrapper whose every slot is full,
the plugin switch, the plan table, and the back-end's split of a mixed batch on a fake ``LLM``.
"""
from __future__ import annotations

import logging

import pytest

from engine.backends import AdapterRef, Sampling, lora_int_id
from engine.tasks import default_data_root

GSM8K = default_data_root() / "gsm8k" / "test.jsonl"
N_PROMPTS, MAX_TOKENS = 4, 24


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return False


# ----------------------------------------------------------------------------- unit tier
@pytest.fixture
def clean_plugin():
    """engine.backends.fast_lora.plugin with nothing installed in this process, before and after."""
    pytest.importorskip("vllm.lora.punica_wrapper.punica_cpu")
    from engine.backends.fast_lora import plugin
    plugin.uninstall()
    yield plugin
    plugin.uninstall()


def test_mask_keeps_no_adapter_tokens_on_the_base_model(clean_plugin):
    """Every LoRA slot holds an adapter, three of six tokens have none (id 0 -> slot -1): vLLM 0.32's
    own wrapper gives them the last slot's delta; masked, it leaves them untouched and computes the
    adapter tokens bit for bit as before."""
    import torch
    from vllm.lora.layers.utils import LoRAMapping
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    if clean_plugin.vllm_version() not in clean_plugin.MASK_VLLM_VERSIONS:
        pytest.skip("the mask is pinned to the vLLM versions whose ops were read (MASK_VLLM_VERSIONS)")
    mapping = [1001, 0, 1002, 0, 0, 1001]
    w = PunicaWrapperCPU(max_num_batched_tokens=64, max_batches=8, device="cpu")
    w.update_metadata(LoRAMapping(mapping, mapping, is_prefill=True), [1001, 1002], 2, 1000)
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(2, 1, 8, 32, generator=g),)  # (slots, 1, r, in)
    b = (torch.randn(2, 1, 16, 8, generator=g),)  # (slots, 1, out, r)
    x, y0 = torch.randn(6, 32, generator=g), torch.randn(6, 16, generator=g)
    base = torch.tensor(mapping) == 0
    y_stock, y_masked = y0.clone(), y0.clone()
    w.add_lora_linear(y_stock, x, a, b, 1.0, (16,))
    assert not torch.allclose(y_stock[base], y0[base])  # the fault
    clean_plugin.install_no_lora_mask()
    w.add_lora_linear(y_masked, x, a, b, 1.0, (16,))
    assert torch.equal(y_masked[base], y0[base])
    assert torch.equal(y_masked[~base], y_stock[~base])
    assert not torch.equal(y_masked[~base], y0[~base])  # the adapters do act


@pytest.mark.parametrize("switch", ["1", "0"])
def test_plugin_masks_vllm_ops_with_fast_kernels_on_or_off(clean_plugin, monkeypatch, switch):
    monkeypatch.setenv("ESSA_FAST_LORA", switch)
    version = clean_plugin.vllm_version()
    clean_plugin.register()
    clean_plugin.register()  # vLLM may call it again: still one layer of masking
    from vllm.lora.punica_wrapper import punica_cpu
    assert clean_plugin.no_lora_mask_installed() == (version in clean_plugin.MASK_VLLM_VERSIONS)
    assert not getattr(getattr(punica_cpu.bgmv_shrink, "__wrapped__", None), "essa_no_lora_mask", False)
    assert clean_plugin.is_installed() == (switch == "1" and version in clean_plugin.TESTED_VLLM_VERSIONS)
    clean_plugin.uninstall()
    assert not clean_plugin.no_lora_mask_installed()


@pytest.mark.parametrize("cpu,mask,fast,eager,expected", [
    (False, False, False, True, "gpu"),   # vLLM's GPU kernels skip id -1 themselves
    (True, True, True, True, "mask"),     # vLLM 0.32 on CPU, fast kernels (the mask covers their fallback)
    (True, True, False, True, "mask"),    # vLLM 0.32 on CPU, engine.fast_lora=false
    (True, False, True, True, "fast"),    # untested vLLM, fast kernels forced, eager
    (True, False, True, False, "split"),  # ... compiled: the fast wrapper falls back to vLLM's unmasked ops
    (True, False, False, True, "split"),  # untested vLLM, its own ops: the back-end splits the batch
])
def test_no_adapter_plan(cpu, mask, fast, eager, expected):
    from engine.backends.fast_lora import plugin
    assert plugin.no_adapter_plan(cpu, mask, fast, eager) == expected
    assert expected in plugin.NO_ADAPTER_PLAN_TEXT


class _FakeLLM:
    """Records every generate call; each output's text names its prompt and adapter."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, params, lora_request, use_tqdm=True):
        from types import SimpleNamespace

        reqs = [(p, getattr(lr, "lora_name", None), sp.seed) for p, sp, lr in zip(prompts, params, lora_request)]
        self.calls.append(reqs)
        return [SimpleNamespace(outputs=[SimpleNamespace(text=f"{p}|{name}|{seed}", token_ids=[1, 2])])
                for p, name, seed in reqs]


@pytest.mark.parametrize("plan,calls", [("split", 2), ("mask", 1), ("fast", 1), ("gpu", 1)])
def test_backend_splits_mixed_batches_only_when_the_engine_cannot_guarantee(plan, calls):
    pytest.importorskip("vllm")
    from engine.backends.vllm_local import VLLMBackend

    be = object.__new__(VLLMBackend)  # the generate logic only, no engine
    be.llm, be.no_adapter = _FakeLLM(), plan
    ad = AdapterRef("a", lora_int_id(0, 0), "/nowhere")
    adapters = [ad, None, ad, None, None]
    out = be.generate([f"p{i}" for i in range(5)], adapters, Sampling(max_tokens=4, temperature=1.0, seed=10))
    # request order and request i's seed (seed + i) are kept however the batch is cut
    assert [o[0].text for o in out] == [f"p{i}|{'a' if a else None}|{10 + i}" for i, a in enumerate(adapters)]
    assert len(be.llm.calls) == calls
    if plan == "split":
        assert [lr for _, lr, _ in be.llm.calls[0]] == [None] * 3 and [lr for _, lr, _ in be.llm.calls[1]] == ["a"] * 2
    be.llm.calls.clear()
    be.generate(["p0", "p1"], [None, None], Sampling(max_tokens=4))  # nothing to split
    be.generate(["p0", "p1"], [ad, ad], Sampling(max_tokens=4))
    assert len(be.llm.calls) == 2


def test_common_seeds_give_a_prompt_one_seed_under_every_adapter():
    """Sampling.common_seeds: the seed follows the prompt, not the request's place in the batch, so
    every candidate (and the centre) draws the same random numbers for a prompt; chunks of a batch
    (Ray) keep it; greedy requests get no seed."""
    pytest.importorskip("vllm")
    from engine.backends.vllm_local import VLLMBackend

    be = object.__new__(VLLMBackend)
    be.llm, be.no_adapter = _FakeLLM(), "mask"
    a, b = AdapterRef("a", lora_int_id(0, 0), "/x"), AdapterRef("b", lora_int_id(0, 1), "/y")
    prompts = ["p0", "p1", "p2"]
    common = Sampling(max_tokens=4, temperature=1.0, seed=7, common_seeds=True)
    be.generate(prompts * 2, [a] * 3 + [b] * 3, common)
    seeds = [seed for _, _, seed in be.llm.calls[-1]]
    assert seeds[:3] == seeds[3:] and len(set(seeds[:3])) == 3   # per prompt, shared across adapters
    assert common.shifted(3) is common and common.request_seeds(prompts, [b] * 3) == seeds[:3]
    # a text drawn twice for one adapter samples twice; its k-th copy shares seeds across adapters
    dup = common.request_seeds(["p0", "p0", "p0", "p0"], [a, a, b, b])
    assert dup[0] != dup[1] and dup[:2] == dup[2:]
    own = Sampling(max_tokens=4, temperature=1.0, seed=7)
    be.generate(prompts * 2, [a] * 3 + [b] * 3, own)
    assert [seed for _, _, seed in be.llm.calls[-1]] == [7 + i for i in range(6)]
    assert own.shifted(3).request_seeds(["p0"], [a]) == own.request_seeds(prompts * 2, [a] * 6)[3:4]
    assert Sampling(temperature=0.0, common_seeds=True).request_seeds(["p0"], [a]) == [None]


# ----------------------------------------------------------------------------- integration tier
@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Model path, tokenizer, four GSM8K test problems and one random adapter on disk."""
    if not GSM8K.exists():
        pytest.skip(f"{GSM8K} missing (set ESSA_DATA)")
    from hydra import compose, initialize_config_dir
    from transformers import AutoConfig, AutoTokenizer

    from engine.lora.files import write_adapter
    from engine.config import CONF_DIR
    from engine.commands import register_configs
    from engine.model import resolve_model_path
    from engine.lora.files import AdapterMeta
    from engine.tasks import load_task
    from tests.helpers import random_lora

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        base = compose(config_name="train", overrides=["+experiment=tiny", "task=gsm8k", f"task.val_size={N_PROMPTS}"])
    model = resolve_model_path(base.model.path)
    lora = random_lora(AutoConfig.from_pretrained(model), seed=0)
    alpha = 2.0 * base.lora.rank
    path = write_adapter(tmp_path_factory.mktemp("adapter") / "random", lora, base.lora.rank, alpha, model)
    return dict(model=model, tokenizer=AutoTokenizer.from_pretrained(model),
                problems=load_task(base.task).val[:N_PROMPTS],
                adapter=AdapterRef("random", lora_int_id(-1, 0), str(path)),
                meta=AdapterMeta(base.lora.rank, alpha, tuple(base.lora.target_modules), model))


def _cfg(backend: str, fast: bool):
    from hydra import compose, initialize_config_dir

    from engine.config import CONF_DIR

    overrides = ["+experiment=tiny", f"engine={backend}", "engine.max_loras=1", f"engine.fast_lora={fast}",
                 "engine.kv_cache_gib=1", "model.dtype=float32"]
    if backend == "ray":
        overrides += ["engine.num_actors=1", "engine.cpus_per_actor=2"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend,fast", [("local", True), pytest.param("local", False, marks=pytest.mark.slow),
                                          ("ray", True), pytest.param("ray", False, marks=pytest.mark.slow)],
                         ids=["local-fast", "local-stock", "ray-fast", "ray-stock"])  # slow: make test-all
def test_no_adapter_rows_are_the_base_model(setup, backend, fast, caplog):
    if fast and _cuda():
        pytest.skip("essa's fast LoRA kernels are CPU only; on a GPU engine.fast_lora changes nothing")
    from tests.helpers import train_evaluator

    caplog.set_level(logging.INFO)
    cfg = _cfg(backend, fast)
    s = setup
    sampling = Sampling(max_tokens=MAX_TOKENS, temperature=0.0, n=1, seed=0)
    ev = train_evaluator(cfg, s["model"], None, s["meta"], s["tokenizer"])
    try:
        _, mixed, *_ = ev.score([None, s["adapter"]], s["problems"], sampling)  # completions [A][N][G]
        _, alone, *_ = ev.score([None], s["problems"], sampling)
    finally:
        if backend == "local":
            ev.backend.close()
        ev.close()
    text = lambda rows: [out[0].text for out in rows]  # noqa: E731
    base, mixed_base, adapted = text(alone[0]), text(mixed[0]), text(mixed[1])
    assert all(base), "empty base completions: the engine did not generate"
    assert sum(a != b for a, b in zip(adapted, base)) >= N_PROMPTS - 1, \
        "the adapter does not change the output: the comparison would say nothing"
    assert mixed_base == base, (f"{backend}, fast_lora={fast}: no-adapter requests that shared a batch with an "
                                f"adapter were not served by the base model:\n{mixed_base}\n!=\n{base}")
    if backend == "local":  # the engine says at start how it keeps such requests on the base model
        assert "requests without an adapter:" in caplog.text


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_common_seeds_make_equal_weights_sample_equal_completions(setup):
    """With real vLLM at temperature 1: the same adapter served as two candidates (two ids) samples
    the same completion for every prompt when the seeds are common, and other completions when each
    request draws its own seed; so under common seeds candidates differ only by their weights."""
    from tests.helpers import train_evaluator

    s = setup
    twin = AdapterRef("twin", lora_int_id(-1, 1), s["adapter"].path)
    ev = train_evaluator(_cfg("local", True), s["model"], None, s["meta"], s["tokenizer"])
    try:
        texts = {}
        for common in (True, False):
            sampling = Sampling(max_tokens=MAX_TOKENS, temperature=1.0, n=1, seed=3, common_seeds=common)
            _, comps, *_ = ev.score([s["adapter"], twin], s["problems"], sampling)
            texts[common] = [[out[0].text for out in rows] for rows in comps]
    finally:
        ev.backend.close()
        ev.close()
    first, second = texts[True]
    assert all(first) and first == second
    first, second = texts[False]
    assert sum(x != y for x, y in zip(first, second)) >= N_PROMPTS - 1
