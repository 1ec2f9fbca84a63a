"""Genome codecs: round trips, dimensions, slice order, zero genome == SFT adapter."""

import random
import warnings

import numpy as np
import pytest
import torch

from strategies.genomes import (
    MODULES,
    LoRAGenome,
    SVDLoRAGenome,
    TinyLoRAGenome,
    benchmark_decode,
    canonical_keys,
    lora_key,
    make_genome,
    random_lora,
)

L, R = 3, 8
SMALL = dict(num_layers=L, rank=R, hidden=48, kv_dim=16)  # tiny shapes keep tests fast


@pytest.fixture
def lora():
    return random_lora(**SMALL, seed=0)


@pytest.fixture
def lora_b0():
    return random_lora(**SMALL, seed=1, zero_b=True)  # ESSA without SFT: B = 0


def assert_lora_close(a, b, atol=1e-5):
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == torch.float32 and a[key].shape == b[key].shape
        assert torch.allclose(a[key], b[key], atol=atol, rtol=0), key


CODECS = [
    ("svd_lora", dict(mode="additive")),
    ("svd_lora", dict(mode="relative")),
    ("svd_lora", dict(alpha=0.5)),
    ("tinylora", dict(u=5)),
    ("tinylora", dict(u=3, tied=False)),
    ("lora", {}),
]


@pytest.mark.parametrize("kind, kwargs", CODECS)
def test_zero_genome_is_input_adapter(lora, kind, kwargs):
    codec = make_genome(kind, lora, **kwargs)
    assert np.array_equal(codec.x0(), np.zeros(codec.dim))
    assert_lora_close(codec.decode(codec.x0()), lora)


@pytest.mark.parametrize("mode", ["additive", "relative"])
def test_zero_genome_with_zero_b(lora_b0, mode):
    if mode == "relative":
        with pytest.warns(UserWarning, match="no effect"):  # zero singular values stay zero
            codec = SVDLoRAGenome(lora_b0, mode=mode)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            codec = SVDLoRAGenome(lora_b0, mode=mode)
    decoded = codec.decode(codec.x0())
    assert_lora_close(decoded, lora_b0)
    assert all(not decoded[k].any() for k in decoded if k.endswith("lora_B.weight"))


@pytest.mark.parametrize("kind, kwargs", CODECS)
def test_round_trip(lora, kind, kwargs):
    codec = make_genome(kind, lora, **kwargs)
    x = np.random.default_rng(0).normal(0.0, 0.05, codec.dim)
    assert np.allclose(codec.encode(codec.decode(x)), x, atol=1e-5, rtol=0)
    assert np.allclose(codec.encode(lora), 0.0, atol=1e-6)


@pytest.mark.parametrize("kind, kwargs", CODECS)
def test_decode_batch_matches_decode(lora, kind, kwargs):
    codec = make_genome(kind, lora, **kwargs)
    xs = np.random.default_rng(1).normal(0.0, 0.05, (4, codec.dim))
    batch = codec.decode_batch(xs)
    assert len(batch) == 4
    for x, decoded in zip(xs, batch):
        assert_lora_close(decoded, codec.decode(x), atol=1e-6)
    # every tensor owns its storage: safetensors refuses tensors that share memory
    pointers = [t.untyped_storage().data_ptr() for d in batch for t in d.values()]
    assert len(set(pointers)) == len(pointers)


def test_decoded_adapter_saves_with_safetensors(lora, tmp_path):
    save_file = pytest.importorskip("safetensors.torch").save_file
    save_file(SVDLoRAGenome(lora).decode_batch(np.zeros((2, L * 4 * 2 * R)))[1], str(tmp_path / "a.safetensors"))


@pytest.mark.parametrize(
    "alpha, k",
    [
        (1.0, 8),  # every singular value (ESSA default)
        (0.5, 4),
        (0.3, 2),  # floor(2.4)
        (0.25, 2),
        (0.125, 1),  # the smallest alpha that still searches something at r = 8
    ],
)
def test_svd_dim(lora, alpha, k):
    codec = SVDLoRAGenome(lora, alpha=alpha)
    assert codec.k == k and codec.dim == L * 4 * 2 * k


def test_svd_dim_paper_example():
    """ESSA §3: Qwen2.5-7B (28 layers), r = 2 -> 448."""
    codec = SVDLoRAGenome(random_lora(num_layers=28, rank=2, hidden=8, kv_dim=4))
    assert codec.dim == 448


def test_lora_dim(lora):
    assert LoRAGenome(lora).dim == sum(t.numel() for t in lora.values())


def test_slice_order_is_canonical():
    layers = [10, 2, 0]  # numeric order must put 10 last
    full = random_lora(num_layers=11, rank=4, hidden=12, kv_dim=8)
    keys = [k for k in full if int(k.split(".")[4]) in layers]
    random.Random(0).shuffle(keys)
    lora = {k: full[k] for k in keys}
    expected = [lora_key(layer, m, f) for layer in (0, 2, 10) for m in MODULES for f in "AB"]
    assert canonical_keys(lora) == expected
    codec = SVDLoRAGenome(lora, alpha=0.5)
    assert codec.slices() == [(key, 2 * i, 2 * i + 2) for i, key in enumerate(expected)]
    assert list(codec.decode(codec.x0())) == expected
    flat = LoRAGenome(lora)
    assert [s[0] for s in flat.slices()] == expected
    assert flat.slices()[-1][2] == flat.dim and all(a[2] == b[1] for a, b in zip(flat.slices(), flat.slices()[1:]))


@pytest.mark.parametrize("mode", ["additive", "relative"])
@pytest.mark.parametrize("index", [0, 5, 13, 2 * 8 * 4 + 7, L * 4 * 2 * 4 - 1])
def test_single_offset_changes_one_singular_value(lora, mode, index):
    codec = SVDLoRAGenome(lora, alpha=0.5, mode=mode)
    delta = 1e-3  # below the gaps between singular values, so the order is kept
    x = np.zeros(codec.dim)
    x[index] = delta
    before, after = codec.decode(codec.x0()), codec.decode(x)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    factor, j = divmod(index, codec.k)
    assert changed == [codec.keys[factor]]
    s0 = torch.linalg.svdvals(before[changed[0]].double()).numpy()
    s1 = torch.linalg.svdvals(after[changed[0]].double()).numpy()
    expected = s0.copy()
    expected[j] += delta if mode == "additive" else delta * s0[j]
    assert np.sum(expected != s0) == 1
    assert np.allclose(np.sort(s1), np.sort(expected), atol=1e-6)


def test_offset_on_zero_b_uses_random_basis(lora_b0):
    """A zero B moves along a random orthonormal basis, not LAPACK's coordinate axes."""
    codec = SVDLoRAGenome(lora_b0)
    key = lora_key(0, "q_proj", "B")
    start = dict((k, a) for k, a, _ in codec.slices())[key]
    x = np.zeros(codec.dim)
    x[start] = 0.5
    b = codec.decode(x)[key].double()
    assert torch.allclose(torch.linalg.svdvals(b)[:2], torch.tensor([0.5, 0.0], dtype=torch.float64), atol=1e-6)
    assert b[R:].abs().sum() > 0  # rows beyond the first r are reachable
    assert np.allclose(codec.encode(codec.decode(x)), x, atol=1e-6)
    again = SVDLoRAGenome(lora_b0).decode(x)[key]
    assert torch.equal(again, codec.decode(x)[key])  # basis_seed makes it deterministic


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda lo: SVDLoRAGenome(lo, alpha=0.1), "strategy.genome.alpha=0.1 gives floor"),  # k = 0
        (lambda lo: SVDLoRAGenome(lo, alpha=1.5), r"strategy.genome.alpha must be in \(0, 1\]"),
        (lambda lo: SVDLoRAGenome(lo, mode="mult"), "strategy.genome.mode"),
        (lambda lo: make_genome("svd", lo), "strategy.genome.kind must be 'svd_lora', 'tinylora' or 'lora'"),
        (lambda lo: TinyLoRAGenome(lo, u=0), "strategy.genome.u must be an integer >= 1"),
        (lambda lo: TinyLoRAGenome(lo, u=2.5), "strategy.genome.u must be an integer >= 1"),
        (lambda lo: TinyLoRAGenome(lo, tied="yes"), "strategy.genome.tied must be true or false"),
        (lambda lo: LoRAGenome({**lo, "model.embed.weight": torch.zeros(2, 2)}), "is not 'base_model"),
        (lambda lo: LoRAGenome({k: v for k, v in lo.items() if ".1.self_attn.v_proj.lora_B" not in k}), "but not"),
        (lambda lo: LoRAGenome({}), "empty"),
    ],
)
def test_bad_inputs(lora, make, match):
    with pytest.raises(ValueError, match=match):
        make(lora)


def test_decode_and_encode_validate(lora):
    codec = SVDLoRAGenome(lora)
    with pytest.raises(ValueError, match=r"expected \(192,\)"):
        codec.decode(np.zeros(3))
    with pytest.raises(ValueError, match="non-finite"):
        codec.decode_batch(np.full((2, codec.dim), np.nan))
    with pytest.raises(ValueError, match="does not match"):
        codec.encode(random_lora(num_layers=L, rank=R, hidden=40, kv_dim=16))


def test_benchmark_decode(capsys):
    """Prints decode_batch timings for P = 16 on a 30-layer rank-8 model (no timing asserts)."""
    result = benchmark_decode(population_size=16, repeats=1)
    assert result["svd_lora_dim"] == 30 * 4 * 2 * 8
    with capsys.disabled():
        svd_ms, lora_ms = result["svd_lora_s"] * 1e3, result["lora_s"] * 1e3
        print(f"\n  decode_batch P=16: svd_lora {svd_ms:.0f} ms, lora {lora_ms:.0f} ms")


@pytest.mark.parametrize("kind, kwargs", CODECS + [("svd_lora", dict(alpha=0.125, mode="relative"))])
def test_decode_torch_decodes_like_the_codec_and_carries_gradients(lora, kind, kwargs):
    """tools/genome_capacity.py's differentiable decode (the gradient oracle of issues 11 and 39) must be
    the genome the run searches: the same factors as decode for any x, and a gradient in x."""
    codec = make_genome(kind, lora, **kwargs)
    x = np.random.default_rng(3).normal(0.0, 0.5, codec.dim).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    got = codec.decode_torch(xt)
    assert_lora_close({k: got[k].detach() for k in codec.keys}, codec.decode(x))
    sum(f.square().sum() for f in got.values()).backward()
    assert xt.grad is not None and xt.grad.abs().sum() > 0


def test_apply_offsets_checks_its_shape_and_agrees_across_numpy_and_torch(lora):
    codec = make_genome("svd_lora", lora, alpha=0.25, mode="relative")
    F, k = len(codec.keys), codec.k
    off = np.random.default_rng(0).normal(0.0, 0.3, (2, F, k))
    s_np = codec.apply_offsets(off)
    s_t = codec.apply_offsets(torch.from_numpy(off))
    assert s_np.shape == (2, F, codec.rank) and np.allclose(s_np, s_t.numpy())
    assert np.array_equal(s_np[..., k:], np.broadcast_to(codec.s[:, k:], (2, F, codec.rank - k)))
    with pytest.raises(ValueError, match=rf"expected \(\.\.\., {F}, {k}\)"):
        codec.apply_offsets(np.zeros((F, 1)))
    factors = codec.compose(codec.apply_offsets(torch.from_numpy(off)))  # float64 in: cast, not an error
    assert_lora_close(factors[1], codec.decode(off[1].reshape(-1)))


@pytest.mark.parametrize("tied", [True, False])
def test_tinylora_moves_each_update_inside_its_own_svd_frame(lora, tied):
    """TinyLoRA (arXiv 2602.04118): A is kept, D = u (tied) or u x modules, and each module's update
    B'A - BA = U sqrt(S) R sqrt(S) V^T lies in the frame of the warm start's B A; tied, one v moves all."""
    codec = TinyLoRAGenome(lora, u=4, tied=tied)
    modules = L * 4
    assert codec.dim == (4 if tied else 4 * modules)
    x = np.random.default_rng(0).normal(0.0, 0.3, codec.dim)
    out = codec.decode(x)
    moved = 0
    for ka, kb in zip(codec.a_keys, codec.b_keys):
        assert torch.equal(out[ka], lora[ka])
        before = lora[kb].double() @ lora[ka].double()
        delta = out[kb].double() @ out[ka].double() - before
        u, _, vh = torch.linalg.svd(before, full_matrices=False)
        u, vh = u[:, :R], vh[:R]
        assert torch.allclose(u @ (u.T @ delta @ vh.T) @ vh, delta, atol=1e-6)
        moved += bool(delta.abs().max() > 1e-6)
    assert moved == modules
    if not tied:  # module 0's slice moves module 0 only
        x0 = np.zeros(codec.dim)
        x0[:4] = 0.3
        changed = [k for k, t in codec.decode(x0).items() if not torch.equal(t, lora[k])]
        assert changed == [codec.b_keys[0]]


def test_tinylora_sigma_means_the_same_change_at_every_u(lora):
    """P ~ N(0, 1 / (r u)): the mean relative change of the updates at genome std 0.3 hardly depends on u."""
    def change(u):
        codec = TinyLoRAGenome(lora, u=u)
        xs = np.random.default_rng(1).normal(0.0, 0.3, (32, codec.dim))
        k = codec.b_keys[0]
        return np.mean([float((d[k] - lora[k]).norm() / lora[k].norm()) for d in codec.decode_batch(xs)])
    small, large = change(2), change(64)
    assert 0.5 < small / large < 2.0, (small, large)


def test_tinylora_zero_update_does_not_move_and_says_so(lora_b0):
    with pytest.warns(UserWarning, match="warm-start update B A is zero"):
        codec = TinyLoRAGenome(lora_b0, u=3)
    assert_lora_close(codec.decode(np.ones(codec.dim)), lora_b0)


def test_tinylora_warns_where_u_exceeds_what_r_can_hold():
    """Untied, one vector feeds one module's r x r R: u > r^2 leaves genome directions that move nothing."""
    small = random_lora(num_layers=1, rank=2, hidden=8, kv_dim=4)
    with pytest.warns(UserWarning, match="u=5 exceeds the 4 entries of R"):
        TinyLoRAGenome(small, u=5, tied=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TinyLoRAGenome(small, u=5, tied=True)  # tied: 4 modules x 4 entries


def test_decode_torch_checks_the_genome_shape(lora):
    for kind, kwargs in CODECS:
        codec = make_genome(kind, lora, **kwargs)
        with pytest.raises(ValueError, match=rf"expected \({codec.dim},\)"):
            codec.decode_torch(torch.zeros(1, codec.dim))
