"""Helpers shared by several test files (imported as ``tests.helpers``; pyproject puts the repository
root on pytest's ``sys.path``, and the files that run themselves as engine scripts insert it)."""
from __future__ import annotations


def random_lora(config, seed: int, rank: int = 8, std: float = 0.03) -> dict:
    """A q/k/v/o LoRA state with N(0, std^2) factors (PEFT keys, float32).

    With alpha = 2r the delta is about 10 % of a weight's scale, enough to change every greedy
    completion.

    Args:
        config: the base model's ``transformers`` config (hidden size, heads, KV heads, layers).
        seed: torch generator seed; the same seed gives the same factors.
        rank: r of every factor: A is (r, d_in), B is (d_out, r).
        std: standard deviation of every factor entry.

    Returns:
        ``{"base_model.model.model.layers.<l>.self_attn.<m>.lora_{A,B}.weight": tensor}`` for every
        layer l and module m in q_proj, k_proj, v_proj, o_proj.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    hd = config.hidden_size // config.num_attention_heads
    dims = {"q_proj": (config.hidden_size, config.num_attention_heads * hd),
            "k_proj": (config.hidden_size, config.num_key_value_heads * hd),
            "v_proj": (config.hidden_size, config.num_key_value_heads * hd),
            "o_proj": (config.num_attention_heads * hd, config.hidden_size)}
    lora = {}
    for layer in range(config.num_hidden_layers):
        for m, (d_in, d_out) in dims.items():
            pre = f"base_model.model.model.layers.{layer}.self_attn.{m}"
            lora[f"{pre}.lora_A.weight"] = torch.randn(rank, d_in, generator=g) * std  # (r, d_in)
            lora[f"{pre}.lora_B.weight"] = torch.randn(d_out, rank, generator=g) * std  # (d_out, r)
    return lora


def train_evaluator(cfg, serve_path: str, codec, meta, tokenizer):
    """The population evaluator ``essa train`` builds for the composed train config ``cfg``
    (engine/commands/train.py ``build_evaluator_phase``)."""
    from engine.evaluation.build import build_evaluator, math_reward

    return build_evaluator(cfg.engine, cfg.model, serve_path, codec, meta, tokenizer, math_reward(cfg.reward),
                           cfg.task.system_prompt, cfg.seed, cfg.strategy.population_size + 2)
