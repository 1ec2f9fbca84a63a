"""Fast CPU multi-LoRA kernels (engine/fast_lora) against vLLM 0.32's torch reference ops.

Unit tests: no engine, seconds. The reference indexes ``W[-1]`` for the no-adapter id -1 (it
applies the last slot's adapter); ours leave those rows untouched like vLLM's GPU kernels. So the
reference is run on weights with an extra all-zero slot that -1 is mapped to, which is the
"no adapter" meaning, and rows that ours must leave untouched are checked against the input.
"""
from __future__ import annotations

import pytest
import torch

ref = pytest.importorskip("vllm.lora.ops.torch_ops.lora_ops")
from engine.backends.fast_lora import ops  # noqa: E402

FP32 = dict(rtol=1e-5, atol=1e-4)  # fp32 summation-order noise on O(10) sums of 576 terms
BF16 = dict(rtol=2e-2, atol=2e-2)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ids(t: int, slots: int, seed: int, none_frac: float = 0.25) -> torch.Tensor:
    """(T,) slot ids, mixed, with ~none_frac of -1; every id appears when T allows."""
    g = _gen(seed)
    idx = torch.randint(0, slots, (t,), generator=g)
    idx[torch.rand(t, generator=g) < none_frac] = -1
    return idx


def _with_zero_slot(w: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Append an all-zero slot and point -1 at it: the reference then means 'no adapter'."""
    w0 = torch.cat([w, torch.zeros_like(w[:1])], 0)
    return w0, torch.where(idx < 0, w.shape[0], idx)


# T tokens, L slots, r rank, d_in, d_out
SHAPES = [(1, 1, 8, 576, 576), (7, 4, 8, 576, 192), (64, 16, 8, 576, 576), (33, 48, 16, 64, 96)]


@pytest.mark.parametrize("t,slots,r,d_in,d_out", SHAPES)
@pytest.mark.parametrize("scaling", [1.0, 0.5])
def test_shrink_matches_reference(t, slots, r, d_in, d_out, scaling):
    g = _gen(t + slots)
    x = torch.randn(t, d_in, generator=g)
    a = torch.randn(slots, 1, r, d_in, generator=g)
    idx = _ids(t, slots, seed=t)
    start = torch.randn(t, r, generator=g)
    out, expect = start.clone(), torch.zeros(t, r)
    ops.bgmv_shrink(x, a, out, idx, scaling)
    a0, idx0 = _with_zero_slot(a, idx)
    ref.bgmv_shrink(x, a0, expect, idx0, scaling)
    valid = idx >= 0
    torch.testing.assert_close(out[valid], expect[valid], **FP32)
    torch.testing.assert_close(out[~valid], start[~valid], rtol=0, atol=0)  # untouched


@pytest.mark.parametrize("t,slots,r,d_in,d_out", SHAPES)
@pytest.mark.parametrize("add_inputs", [True, False])
def test_expand_matches_reference(t, slots, r, d_in, d_out, add_inputs):
    g = _gen(2 * t + slots)
    x = torch.randn(t, r, generator=g)
    b = torch.randn(slots, 1, d_out, r, generator=g)
    idx = _ids(t, slots, seed=t + 1)
    start = torch.randn(t, d_out, generator=g)
    out, expect = start.clone(), start.clone()
    ops.bgmv_expand(x, b, out, idx, add_inputs)
    b0, idx0 = _with_zero_slot(b, idx)
    ref.bgmv_expand(x, b0, expect, idx0, add_inputs)
    valid = idx >= 0
    torch.testing.assert_close(out[valid], expect[valid], **FP32)
    torch.testing.assert_close(out[~valid], start[~valid], rtol=0, atol=0)


@pytest.mark.parametrize("t,slots,r,d_in,d_out", SHAPES)
@pytest.mark.parametrize("add_inputs", [True, False])
def test_expand_slice_matches_reference(t, slots, r, d_in, d_out, add_inputs):
    g = _gen(3 * t + slots)
    x = torch.randn(t, r, generator=g)
    b = torch.randn(slots, 1, d_out, r, generator=g)
    idx = _ids(t, slots, seed=t + 2)
    offset, width = 5, d_out + 11  # the slice sits inside a wider output
    start = torch.randn(t, width, generator=g)
    out, expect = start.clone(), start.clone()
    ops.bgmv_expand_slice(x, b, out, idx, offset, d_out, add_inputs)
    b0, idx0 = _with_zero_slot(b, idx)
    ref.bgmv_expand_slice(x, b0, expect, idx0, offset, d_out, add_inputs)
    valid = idx >= 0
    torch.testing.assert_close(out[valid], expect[valid], **FP32)
    torch.testing.assert_close(out[~valid], start[~valid], rtol=0, atol=0)
    # columns outside the slice are never written
    torch.testing.assert_close(out[:, :offset], start[:, :offset], rtol=0, atol=0)
    torch.testing.assert_close(out[:, offset + d_out:], start[:, offset + d_out:], rtol=0, atol=0)


def test_expand_slice_rejects_wrong_size():
    with pytest.raises(ValueError, match="slice_size"):
        ops.bgmv_expand_slice(torch.zeros(2, 8), torch.zeros(3, 1, 16, 8), torch.zeros(2, 40),
                              torch.zeros(2, dtype=torch.long), 0, 17)


def test_sgmv_variants_match_reference():
    """Prefill form: per-sequence ids and lengths (vLLM's compute_meta), ids without -1."""
    g = _gen(7)
    slots, r, d_in, d_out = 4, 8, 64, 48
    seq_ids = torch.tensor([2, 0, 3, 0, 1])
    seq_len = torch.tensor([3, 1, 4, 2, 5])
    t = int(seq_len.sum())
    starts = torch.cumsum(seq_len, 0) - seq_len
    meta = (starts, seq_len, seq_ids, len(seq_ids), int(seq_len.max()), t)
    x = torch.randn(t, d_in, generator=g)
    a = torch.randn(slots, 1, r, d_in, generator=g)
    b = torch.randn(slots, 1, d_out, r, generator=g)
    s_fast, s_ref = torch.zeros(t, r), torch.zeros(t, r)
    ops.sgmv_shrink(x, a, s_fast, *meta, 0.5)
    ref.sgmv_shrink(x, a, s_ref, *meta, 0.5)
    torch.testing.assert_close(s_fast, s_ref, **FP32)
    y0 = torch.randn(t, d_out + 8, generator=g)
    y_fast, y_ref = y0.clone(), y0.clone()
    ops.sgmv_expand(s_ref, b, y_fast, *meta, True)
    ref.sgmv_expand(s_ref, b, y_ref, *meta, True)
    torch.testing.assert_close(y_fast, y_ref, **FP32)
    y_fast, y_ref = y0.clone(), y0.clone()
    ops.sgmv_expand_slice(s_ref, b, y_fast, *meta, 8, d_out, False)
    ref.sgmv_expand_slice(s_ref, b, y_ref, *meta, 8, d_out, False)
    torch.testing.assert_close(y_fast, y_ref, **FP32)


# ------------------------------------------------------------------------------------------------
# Fused path (what the punica wrapper runs): lora_linear against the reference composition
# ------------------------------------------------------------------------------------------------

def _reference_linear(y, x, a_stacked, b_stacked, idx, scale, outs):
    """vLLM's PunicaWrapperCPU.add_lora_linear, in reference ops, -1 mapped to a zero slot."""
    buf = [torch.zeros(x.shape[0], a.shape[2]) for a in a_stacked]
    for i, a in enumerate(a_stacked):
        a0, idx0 = _with_zero_slot(a, idx)
        ref.bgmv_shrink(x, a0, buf[i], idx0, scale)
    off = 0
    for i, (b, o) in enumerate(zip(b_stacked, outs)):
        b0, idx0 = _with_zero_slot(b, idx)
        ref.bgmv_expand_slice(buf[i], b0, y, idx0, off, o, True)
        off += o


def _layer(slots, r, d_in, outs, dtype, seed):
    g = _gen(seed)
    a = tuple(torch.randn(slots, 1, r, d_in, generator=g).to(dtype) * 0.1 for _ in outs)
    b = tuple(torch.randn(slots, 1, o, r, generator=g).to(dtype) * 0.1 for o in outs)
    return a, b


def _plan(idx, slots, path):
    """A plan of the requested layout: "runs" (no copy, when the ids allow it) or "sorted"."""
    plan = ops.plan_tokens(idx, slots, allow_runs=(path == "runs"))
    assert plan.mode == "grouped"
    if path == "sorted":
        assert plan.perm is not None
    return plan


BATCHES = {  # name -> (T, slot ids builder)
    "balanced": (64, lambda t, L: torch.arange(t) % L),
    "population_runs": (64, lambda t, L: torch.arange(t) // (t // L)),  # P runs of B tokens: no copy
    "permuted_runs": (64, lambda t, L: (torch.arange(t) // (t // L) * 3 + 1) % L),
    "unequal_runs_with_none": (40, lambda t, L: torch.tensor([1] * 9 + [-1] * 6 + [0] * 13 + [L - 1] * 12)),
    "mixed_with_none": (50, lambda t, L: _ids(t, L, seed=3)),
    "skewed": (96, lambda t, L: torch.cat([torch.zeros(80, dtype=torch.long), torch.arange(16) % L])),
    "one_token": (1, lambda t, L: torch.tensor([L - 1])),
}


@pytest.mark.parametrize("batch", sorted(BATCHES))
@pytest.mark.parametrize("path", ["runs", "sorted"])
@pytest.mark.parametrize("outs", [(576, 192, 192), (576,)], ids=["qkv", "o"])
@pytest.mark.parametrize("slots", [4, 16])
def test_lora_linear_fp32_matches_reference(batch, path, outs, slots):
    t, make = BATCHES[batch]
    idx = make(t, slots)
    a, b = _layer(slots, 8, 576, outs, torch.float32, seed=slots + t)
    x = torch.randn(t, 576, generator=_gen(t))
    start = torch.randn(t, sum(outs), generator=_gen(t + 1))
    expect = start.clone()
    _reference_linear(expect, x, a, b, idx, 0.5, outs)
    plan = _plan(idx, slots, path)
    a_slot, b_slot = ops.build_slot_weights(a, b, torch.float32)
    y = start.clone()
    ops.lora_linear(y, x, a_slot, b_slot, plan, scale=0.5)
    torch.testing.assert_close(y, expect, **FP32)
    none = idx < 0
    torch.testing.assert_close(y[none], start[none], rtol=0, atol=0)


@pytest.mark.parametrize("path", ["runs", "sorted"])
def test_lora_linear_bf16_close_to_reference(path):
    """Serving dtype: bf16 activations/weights, as vLLM hands them to the wrapper."""
    slots, t, outs = 16, 256, (576, 192, 192)
    idx = _ids(t, slots, seed=11, none_frac=0.1)
    a, b = _layer(slots, 8, 576, outs, torch.bfloat16, seed=5)
    x = torch.randn(t, 576, generator=_gen(12)).bfloat16()
    start = torch.randn(t, sum(outs), generator=_gen(13)).bfloat16()
    expect = start.clone()
    _reference_linear(expect, x, a, b, idx, 1.0, outs)
    plan = _plan(idx, slots, path)
    y = start.clone()
    ops.lora_linear(y, x, *ops.build_slot_weights(a, b, torch.bfloat16), plan)
    torch.testing.assert_close(y.float(), expect.float(), **BF16)


def test_lora_linear_offset_start_writes_only_its_columns():
    slots, t, outs = 4, 12, (32, 16)
    idx = torch.arange(t) % slots
    a, b = _layer(slots, 8, 40, outs, torch.float32, seed=1)
    x = torch.randn(t, 40)
    start = torch.randn(t, 7 + sum(outs) + 5)
    y = start.clone()
    ops.lora_linear(y, x, *ops.build_slot_weights(a, b, torch.float32),
                    ops.plan_tokens(idx, slots), offset_start=7)
    expect = start[:, 7:7 + sum(outs)].clone()
    _reference_linear(expect, x, a, b, idx, 1.0, outs)
    torch.testing.assert_close(y[:, 7:7 + sum(outs)], expect, **FP32)
    torch.testing.assert_close(y[:, :7], start[:, :7], rtol=0, atol=0)
    torch.testing.assert_close(y[:, 7 + sum(outs):], start[:, 7 + sum(outs):], rtol=0, atol=0)


def test_lora_linear_rejects_mismatched_plan():
    a, b = _layer(4, 8, 16, (8,), torch.float32, seed=0)
    plan = ops.plan_tokens(torch.zeros(3, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="plan is for"):
        ops.lora_linear(torch.zeros(5, 8), torch.zeros(5, 16), *ops.build_slot_weights(a, b, torch.float32), plan)


# ------------------------------------------------------------------------------------------------
# Planning and caching
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("idx,slots,mode,no_copy", [
    (torch.arange(256) // 16, 16, "grouped", True),              # ESSA decode: P runs of B tokens
    ((torch.arange(256) // 16 * 7) % 16, 16, "grouped", True),    # ... in any slot order
    (torch.arange(256) % 16, 16, "grouped", False),              # interleaved: sorted by slot
    (torch.tensor([-1, -1, -1]), 4, "none", None),               # base model only: nothing to do
    (torch.tensor([], dtype=torch.long), 4, "none", None),       # empty batch
    (torch.tensor([3, -1, 0]), 4, "grouped", True),              # tiny decode batch
    (torch.tensor([2] * 9 + [0] * 4), 4, "grouped", False),      # unequal runs (prefill)
])
def test_plan_tokens_choice(idx, slots, mode, no_copy):
    plan = ops.plan_tokens(idx, slots)
    assert plan.mode == mode
    if mode == "grouped":
        assert (plan.perm is None) == no_copy


@pytest.mark.parametrize("idx", [
    _ids(37, 5, seed=2),
    torch.cat([torch.zeros(2000, dtype=torch.long), torch.randint(0, 5, (100,), generator=_gen(0))]),
])
def test_plan_tokens_sorted_layout(idx):
    """Every token sits in exactly one unit of its own slot; padding is bounded."""
    plan = ops.plan_tokens(idx, 5, allow_runs=False)
    t = idx.shape[0]
    assert sorted(plan.perm[plan.inv].tolist()) == list(range(t))
    slot_of_token = plan.units[plan.inv // plan.group_size]
    torch.testing.assert_close(slot_of_token, torch.where(idx < 0, 5, idx))
    assert plan.units.shape[0] * plan.group_size <= 2 * t + ops.UNIT_COST_ROWS * 6


def test_skewed_batch_is_chunked_not_padded_per_slot():
    """One long prefill run plus scattered decode tokens: units are chunks, not 6 x 2000 rows."""
    idx = torch.cat([torch.zeros(2000, dtype=torch.long), torch.arange(1, 5).repeat(25)])
    plan = ops.plan_tokens(idx, 5)
    assert plan.units.shape[0] * plan.group_size < 1.5 * idx.shape[0]


def test_unit_weights_are_cached_per_plan():
    a, b = _layer(4, 8, 16, (8,), torch.float32, seed=0)
    cache = ops.SlotWeightCache()
    plan = ops.plan_tokens(torch.tensor([2, 2, 0, 0, 3, 3]), 4)
    assert plan.mode == "grouped" and not plan.units_are_prefix and plan.perm is None
    u1 = cache.get_units(a, b, torch.float32, plan)
    assert cache.get_units(a, b, torch.float32, plan)[0] is u1[0]
    a_slot, _ = cache.get(a, b, torch.float32)
    torch.testing.assert_close(u1[0], a_slot[[2, 0, 3]])
    plan2 = ops.plan_tokens(torch.tensor([2, 2, 0, 0, 3, 3]), 4)
    assert cache.get_units(a, b, torch.float32, plan2)[0] is not u1[0]


def test_lora_linear_is_batch_invariant_in_bf16():
    """A token's result is bitwise the same whatever batch and layout it is computed in, so greedy
    completions do not depend on how vLLM happened to schedule the requests."""
    slots, outs = 5, (576, 192, 192)
    a, b = _layer(slots, 8, 576, outs, torch.bfloat16, seed=3)
    a_slot, b_slot = ops.build_slot_weights(a, b, torch.bfloat16)
    x_all = torch.randn(900, 576, generator=_gen(4)).bfloat16()
    y_all = torch.randn(900, 960, generator=_gen(5)).bfloat16()

    def token0(idx, allow_runs=True):  # token 0 is always on slot 2
        t = idx.shape[0]
        y = y_all[:t].clone()
        ops.lora_linear(y, x_all[:t], a_slot, b_slot, ops.plan_tokens(idx, slots, allow_runs))
        return y[0]

    ref = token0(torch.tensor([2]))
    batches = [torch.tensor([2, 2, 2, 2]), torch.tensor([2] * 4 + [0] * 4 + [-1] * 4),
               torch.cat([torch.full((300,), 2), torch.full((250,), 0), torch.full((304,), -1)]),
               torch.tensor([2, 0, 1, 2, 0, 1, -1, 3]), torch.cat([torch.tensor([2]), _ids(700, slots, seed=6)])]
    for idx in batches:
        for allow_runs in (True, False):
            assert torch.equal(token0(idx, allow_runs), ref), (idx.shape, allow_runs)


def test_slot_weight_cache_rebuilds_on_change():
    a, b = _layer(4, 8, 16, (8, 4), torch.float32, seed=0)
    cache = ops.SlotWeightCache()
    a1, _ = cache.get(a, b, torch.float32)
    a2, _ = cache.get(a, b, torch.float32)
    assert a1 is a2 and cache.builds == 1
    a[0][2].fill_(1.0)  # vLLM's set_lora writes slots in place -> version counter moves
    a3, _ = cache.get(a, b, torch.float32)
    assert cache.builds == 2 and torch.all(a3[2, :8] == 1.0)
    cache.invalidate()
    cache.get(a, b, torch.float32)
    assert cache.builds == 3
    assert not cache.is_zero(a, b, torch.float32)
    z = tuple(torch.zeros_like(t) for t in a)
    assert cache.is_zero(z, b, torch.float32)  # a layer no adapter targets (e.g. the MLP): skipped


def test_build_slot_weights_layout():
    a, b = _layer(3, 2, 5, (4, 6), torch.float32, seed=9)
    a_slot, b_slot = ops.build_slot_weights(a, b, torch.float32)
    assert a_slot.shape == (4, 4, 5) and b_slot.shape == (4, 4, 10)
    torch.testing.assert_close(a_slot[1, 2:4], a[1][1, 0])
    torch.testing.assert_close(b_slot[2, 2:4, 4:10], b[1][2, 0].t())
    assert torch.all(b_slot[2, 0:2, 4:10] == 0) and torch.all(b_slot[2, 2:4, 0:4] == 0)
    assert torch.all(a_slot[3] == 0) and torch.all(b_slot[3] == 0)  # the no-adapter slot


# ------------------------------------------------------------------------------------------------
# The punica wrapper with vLLM's own metadata, and the plugin switch
# ------------------------------------------------------------------------------------------------

def _wrappers(index_mapping, prompt_mapping, lora_index_to_id):
    from vllm.lora.layers.utils import LoRAMapping
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    from engine.backends.fast_lora.punica import FastPunicaWrapperCPU

    out = []
    for cls in (PunicaWrapperCPU, FastPunicaWrapperCPU):
        w = cls(max_num_batched_tokens=512, max_batches=64, device="cpu")
        w.update_metadata(LoRAMapping(index_mapping, prompt_mapping, is_prefill=True),
                          lora_index_to_id, len(lora_index_to_id) + 1, 1000)
        out.append(w)
    return out


@pytest.mark.parametrize("decode", [False, True])
def test_wrapper_matches_vllm_wrapper(decode):
    """Same metadata path as the engine (LoRAMapping -> update_metadata); ids 1001.. in 4 slots,
    the last slot empty so vLLM's -1 quirk cannot show, some tokens on the base model (id 0)."""
    slots = 4
    lora_index_to_id = [1001, 1002, 1003, None]
    if decode:  # one token per request, interleaved
        index_mapping = [1001, 1002, 0, 1003, 1001, 1002, 1003, 0] * 4
        prompt_mapping = index_mapping
    else:  # prefill: runs of tokens per request
        runs = [(1002, 9), (0, 4), (1001, 17), (1003, 6)]
        index_mapping = [i for i, n in runs for _ in range(n)]
        prompt_mapping = [i for i, _ in runs]
    stock, fast = _wrappers(index_mapping, prompt_mapping, lora_index_to_id)
    t, outs = len(index_mapping), (576, 192, 192)
    a, b = _layer(slots, 8, 576, outs, torch.float32, seed=t)
    for w in (*a, *b):
        w[3].zero_()  # vLLM keeps empty slots zeroed
    x = torch.randn(t, 576, generator=_gen(1))
    y0 = torch.randn(t, sum(outs), generator=_gen(2))
    y_stock, y_fast = y0.clone(), y0.clone()
    stock.add_lora_linear(y_stock, x, a, b, 1.0, outs)
    fast.add_lora_linear(y_fast, x, a, b, 1.0, outs)
    torch.testing.assert_close(y_fast, y_stock, **FP32)


def test_wrapper_skips_layers_without_weights():
    stock, fast = _wrappers([1001, 1002] * 4, [1001, 1002] * 4, [1001, 1002])
    a = tuple(torch.zeros(2, 1, 8, 32) for _ in range(2))
    b = tuple(torch.zeros(2, 1, 16, 8) for _ in range(2))
    y0 = torch.randn(8, 32)
    y = y0.clone()
    fast.add_lora_linear(y, torch.randn(8, 32), a, b, 1.0, (16, 16))
    torch.testing.assert_close(y, y0, rtol=0, atol=0)


def test_wrapper_all_base_model_is_a_no_op():
    stock, fast = _wrappers([0] * 10, [0, 0], [1001, None])
    a, b = _layer(2, 8, 32, (16,), torch.float32, seed=0)
    y0 = torch.randn(10, 16)
    y = y0.clone()
    fast.add_lora_linear(y, torch.randn(10, 32), a, b, 1.0, (16,))
    torch.testing.assert_close(y, y0, rtol=0, atol=0)


@pytest.fixture
def clean_plugin():
    from engine.backends.fast_lora import plugin
    plugin.uninstall()
    yield plugin
    plugin.uninstall()


def test_plugin_installs_on_tested_cpu_vllm(clean_plugin, monkeypatch):
    from vllm.platforms.cpu import CpuPlatform
    monkeypatch.delenv("ESSA_FAST_LORA", raising=False)
    before = CpuPlatform.get_punica_wrapper()
    clean_plugin.register()
    if clean_plugin.vllm_version() not in clean_plugin.TESTED_VLLM_VERSIONS:
        pytest.skip("installed vLLM is not a tested version")
    assert clean_plugin.is_installed()
    assert CpuPlatform.get_punica_wrapper() == "engine.backends.fast_lora.punica.FastPunicaWrapperCPU"
    clean_plugin.register()  # idempotent
    clean_plugin.uninstall()
    assert CpuPlatform.get_punica_wrapper() == before


@pytest.mark.parametrize("value", ["0", "false", "off"])
def test_plugin_switch_off(clean_plugin, monkeypatch, value):
    monkeypatch.setenv("ESSA_FAST_LORA", value)
    clean_plugin.register()
    assert not clean_plugin.is_installed()


def test_plugin_refuses_untested_version(clean_plugin, monkeypatch, caplog):
    import logging
    monkeypatch.delenv("ESSA_FAST_LORA", raising=False)
    monkeypatch.setattr(clean_plugin, "vllm_version", lambda: "9.9.9")
    monkeypatch.setattr(clean_plugin, "_warned", False)
    logging.getLogger("vllm.essa_fast_lora").propagate = True  # vLLM's own handler may not propagate
    with caplog.at_level(logging.WARNING, logger="vllm.essa_fast_lora"):
        clean_plugin.register()
    assert not clean_plugin.is_installed()
    assert "not among the tested versions" in caplog.text
    monkeypatch.setenv("ESSA_FAST_LORA", "force")
    clean_plugin.register()
    assert clean_plugin.is_installed()


def test_no_adapter_tokens_untouched_when_every_slot_is_full(clean_plugin):
    """vLLM 0.32's torch ops would apply the LAST slot's adapter to id-0 (base model) tokens here
    (they index W[-1]); the fast wrapper gives them no delta, like vLLM's GPU kernels. (``clean_plugin``:
    vLLM's ops without the plugin's no-adapter mask, tests/test_no_adapter_batch.py.)"""
    index_mapping = [1001, 0, 1002, 0, 1002, 1001]
    stock, fast = _wrappers(index_mapping, index_mapping, [1001, 1002])
    a, b = _layer(2, 8, 32, (16,), torch.float32, seed=4)
    x, y0 = torch.randn(6, 32), torch.randn(6, 16)
    y_stock, y_fast = y0.clone(), y0.clone()
    stock.add_lora_linear(y_stock, x, a, b, 1.0, (16,))
    fast.add_lora_linear(y_fast, x, a, b, 1.0, (16,))
    base = torch.tensor(index_mapping) == 0
    torch.testing.assert_close(y_fast[base], y0[base], rtol=0, atol=0)
    torch.testing.assert_close(y_fast[~base], y_stock[~base], **FP32)
    assert not torch.allclose(y_stock[base], y0[base])  # the reference quirk, pinned to vLLM 0.32


def _lm_head(slots: int, r: int, hidden: int, vocab: int, used_slot: int | None, seed: int):
    """LoRA-A (L, 1, r, hidden) and B (L, 1, vocab, r) of the LM head, zero except ``used_slot``."""
    g = _gen(seed)
    a = torch.zeros(slots, 1, r, hidden)
    b = torch.zeros(slots, 1, vocab, r)
    if used_slot is not None:
        a[used_slot] = torch.randn(1, r, hidden, generator=g) / hidden ** 0.5
        b[used_slot] = torch.randn(1, vocab, r, generator=g)
    return a, b


@pytest.mark.parametrize("lm_head_slot", [None, 2])  # no adapter has lm_head weights / one not in the batch
def test_logits_lora_skipped_when_no_request_targets_lm_head(monkeypatch, lm_head_slot):
    # issue 10: add_lora_logits ran bgmv_shrink/expand over the whole vocabulary at every decode step
    # although ESSA's adapters never target lm_head. Skipping must leave the logits bit for bit as
    # vLLM's own wrapper leaves them, and must not call the kernels.
    from engine.backends.fast_lora import ops

    # decode: one token per request; slot 2 (id 1003) not in the batch; the last slot empty (vLLM's
    # torch ops give base-model tokens the last slot's delta)
    mapping = [1001, 1002, 0, 1001]
    stock, fast = _wrappers(mapping, mapping, [1001, 1002, 1003, None])
    a, b = _lm_head(4, 8, 64, 500, lm_head_slot, seed=3)
    x = torch.randn(4, 64, generator=_gen(4))
    y0 = torch.randn(4, 500, generator=_gen(5))
    y_stock, y_fast = y0.clone(), y0.clone()
    stock.add_lora_logits(y_stock, x, a, b, 1.0)
    calls = []
    for name in ("bgmv_shrink", "bgmv_expand"):
        monkeypatch.setattr(ops, name, lambda *args, _n=name, **kw: calls.append(_n))
    fast.add_lora_logits(y_fast, x, a, b, 1.0)
    assert calls == []
    assert torch.equal(y_fast, y0) and torch.equal(y_stock, y0)


def test_logits_lora_still_applied_when_a_request_targets_lm_head():
    mapping = [1001, 1002, 0, 1001]
    stock, fast = _wrappers(mapping, mapping, [1001, 1002, 1003])
    a, b = _lm_head(3, 8, 64, 500, used_slot=1, seed=6)  # id 1002 has lm_head weights
    x = torch.randn(4, 64, generator=_gen(7))
    y0 = torch.randn(4, 500, generator=_gen(8))
    y_stock, y_fast = y0.clone(), y0.clone()
    stock.add_lora_logits(y_stock, x, a, b, 1.0)
    fast.add_lora_logits(y_fast, x, a, b, 1.0)
    torch.testing.assert_close(y_fast, y_stock, **FP32)
    assert not torch.equal(y_fast[1], y0[1]) and torch.equal(y_fast[0], y0[0])  # only request 1002's row moves
    b.zero_()  # the slot emptied in place: a new mapping (vLLM's update_metadata) must see it
    fast.update_metadata(*_mapping_args(mapping, [1001, 1002, 1003]))
    y_again = y0.clone()
    fast.add_lora_logits(y_again, x, a, b, 1.0)
    assert torch.equal(y_again, y0)


def _mapping_args(mapping, lora_index_to_id):
    from vllm.lora.layers.utils import LoRAMapping
    return LoRAMapping(mapping, mapping, is_prefill=True), lora_index_to_id, len(lora_index_to_id) + 1, 1000


def test_embedding_lora_skipped_without_embedding_weights(monkeypatch):
    from engine.backends.fast_lora import ops

    mapping = [1001, 1001, 1002, 0]
    stock, fast = _wrappers(mapping, mapping, [1001, 1002])
    b = torch.zeros(2, 1, 32, 8)
    x = torch.randn(4, 8, generator=_gen(9))
    y0 = torch.randn(4, 32, generator=_gen(10))
    y = y0.clone()
    monkeypatch.setattr(ops, "bgmv_expand", lambda *args, **kw: pytest.fail("embedding LoRA ran on zero weights"))
    fast.add_lora_embedding(y, x, b)
    assert torch.equal(y, y0)
