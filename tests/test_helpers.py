"""The shared test helpers (tests/helpers.py) import in-process under pytest and keep their contract."""
from __future__ import annotations

from types import SimpleNamespace


def test_random_lora_shapes_keys_and_seed():
    import torch

    from tests.helpers import random_lora

    # GQA like SmolLM2: 4 query heads of width 8, 2 KV heads, 2 layers
    config = SimpleNamespace(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2)
    lora = random_lora(config, seed=3, rank=4)
    assert len(lora) == 2 * 4 * 2  # layers x {q,k,v,o} x {A, B}
    pre = "base_model.model.model.layers.1.self_attn"
    assert lora[f"{pre}.q_proj.lora_A.weight"].shape == (4, 32) and lora[f"{pre}.q_proj.lora_B.weight"].shape == (32, 4)
    assert lora[f"{pre}.k_proj.lora_B.weight"].shape == (16, 4) and lora[f"{pre}.o_proj.lora_A.weight"].shape == (4, 32)
    again, other = random_lora(config, seed=3, rank=4), random_lora(config, seed=4, rank=4)
    assert all(torch.equal(v, again[k]) for k, v in lora.items())
    assert not torch.equal(lora[f"{pre}.v_proj.lora_A.weight"], other[f"{pre}.v_proj.lora_A.weight"])
