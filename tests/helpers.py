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


def hf_target_logprobs(model, pairs) -> list:
    """Reference scores from transformers (+ peft): log p of each target token given its prefix, in the
    model's dtype, one sequence at a time (no padding). Returns (T_r,) float64 arrays, as
    ``engine.evaluation.prefill.target_logprobs``."""
    import numpy as np
    import torch

    out = []
    with torch.no_grad():
        for prefix, target in pairs:
            ids = torch.tensor([list(prefix) + list(target)])
            logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)  # (T, V)
            pos = torch.arange(len(prefix) - 1, ids.shape[1] - 1)
            out.append(logp[pos, ids[0, pos + 1]].double().numpy().astype(np.float64))
    return out


def wandb_history(run_dir) -> list[dict]:
    """The history rows (``run.log`` calls) of every offline W&B run under ``run_dir``, in order."""
    import json

    return [{it.key or "/".join(it.nested_key): json.loads(it.value_json) for it in record.history.item}
            for record in wandb_records(run_dir) if record.WhichOneof("record_type") == "history"]


def wandb_exit_codes(run_dir) -> list[int]:
    """The exit codes (``run.finish(exit_code=)``) of every offline W&B run under ``run_dir``, in order."""
    return [record.exit.exit_code for record in wandb_records(run_dir) if record.WhichOneof("record_type") == "exit"]


def wandb_records(run_dir) -> list:
    """The records (``wandb_internal_pb2.Record``) of every offline W&B run under ``run_dir``, in order.

    wandb 0.31 has no Python reader of its ``run-<id>.wandb`` files (the Go core writes them), so this reads
    the container itself: a 7-byte header (``:W&B``, magic, version) then LevelDB's log format (32 KiB blocks
    of records: crc32 (4 bytes), length (2), type (1: full, 2: first, 3: middle, 4: last), data; a block's
    tail shorter than a header is padding), each record's data a ``wandb_internal_pb2.Record`` decoded by
    wandb's own protobuf classes.
    """
    import struct
    from pathlib import Path

    from wandb.proto import wandb_internal_pb2 as pb

    records = []
    for path in sorted(Path(run_dir).rglob("run-*.wandb")):
        data, i, pending = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
        while i + 7 <= len(data):
            if 32768 - i % 32768 < 7:  # padding at the end of a block
                i += 32768 - i % 32768
                continue
            _, n, kind = struct.unpack("<IHB", data[i:i + 7])
            pending, i = pending + data[i + 7:i + 7 + n], i + 7 + n
            if kind in (1, 4):  # a whole record, or the last piece of one
                record = pb.Record()
                record.ParseFromString(pending)
                pending = b""
                records.append(record)
    return records
