"""The GEMM roofline of a generation: how close the engine runs to torch's matmul rate on the model's own shapes.

A decoder's tokens are mostly GEMMs: per token and layer the q, k, v, o projections and the MLP's gate,
up and down; per generated token also the LM head. 2 x (weights in those GEMMs) FLOPs per token is the
usual count (Kaplan et al. 2020, arXiv 2001.08361, Table 1, without the attention term). Torch's rate
on exactly those shapes, in the run's dtype and this process's thread count, measured here, is the
limit a generation is compared with: "generation at X % of the GEMM limit" (issue 37).

What it leaves out: attention over the KV cache, LoRA, sampling and scheduling cost time but are not
counted as FLOPs, so the fraction is what the model's GEMMs get of the generate call's wall time.
Prompt tokens are counted once per request (a prefix cache that skips a shared system prompt makes
the true FLOPs lower).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelShapes:
    """The GEMM widths of a Llama-style decoder (Hugging Face ``config.json`` names)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_config(cls, config: dict) -> ModelShapes:
        """From a ``config.json`` dict. Raises KeyError naming the missing field."""
        for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
            if k not in config:
                raise KeyError(f"config.json has no {k!r}: the roofline needs a Llama-style decoder's config")
        heads = int(config["num_attention_heads"])
        return cls(hidden=int(config["hidden_size"]), intermediate=int(config["intermediate_size"]),
                   layers=int(config["num_hidden_layers"]), heads=heads,
                   kv_heads=int(config.get("num_key_value_heads") or heads),
                   head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
                   vocab=int(config["vocab_size"]))

    @classmethod
    def from_path(cls, model_path: str | Path) -> ModelShapes:
        """From the ``config.json`` of a local checkpoint directory."""
        import json

        return cls.from_config(json.loads((Path(model_path) / "config.json").read_text()))

    def layer_gemms(self) -> dict[str, tuple[int, int]]:
        """``{name: (in, out)}`` of one layer's weight matrices."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"q": (self.hidden, q), "k": (self.hidden, kv), "v": (self.hidden, kv), "o": (q, self.hidden),
                "gate": (self.hidden, self.intermediate), "up": (self.hidden, self.intermediate),
                "down": (self.intermediate, self.hidden)}

    def gemms(self) -> dict[str, tuple[int, int]]:
        """One layer's matrices plus the LM head ``(hidden, vocab)``."""
        return {**self.layer_gemms(), "lm_head": (self.hidden, self.vocab)}

    @property
    def layer_params(self) -> int:
        """Weights in the GEMMs of all layers (embeddings, norms and the LM head not included)."""
        return self.layers * sum(i * o for i, o in self.layer_gemms().values())


def generation_flops(shapes: ModelShapes, prompt_tokens: int, completion_tokens: int) -> float:
    """GEMM FLOPs of a generate call: 2 x layer weights per prompt and completion token, plus the LM head
    (2 x hidden x vocab) per completion token (logits are computed for sampled positions only)."""
    return (2.0 * shapes.layer_params * (prompt_tokens + completion_tokens)
            + 2.0 * shapes.hidden * shapes.vocab * completion_tokens)


def gemm_rate(shapes: ModelShapes, rows: int, dtype: str = "float32", seconds: float = 1.0) -> dict:
    """Torch's matmul rate on the model's shapes, measured now in this process (its current thread count).

    Each weight (in, out) of :meth:`ModelShapes.gemms` is multiplied by an (``rows``, in) activation,
    repeatedly for its share of ``seconds`` (at least once; one untimed warm-up call first); the rate
    is the FLOPs of one token through the model (every layer's matrices ``layers`` times, the LM head once) over the
    time those calls take, so each shape counts as much as it does in a decode step.

    Args:
        shapes: the model's GEMM widths. rows: M, the tokens in one engine step (e.g. 256).
        dtype: a torch dtype name (``float32``, ``bfloat16``, ``float16``). seconds: the timed budget.

    Returns:
        ``{"gflops": float, "rows": M, "dtype": str, "threads": int, "seconds": float}``.

    Raises:
        ValueError: rows < 1, or a dtype torch does not know.
    """
    import torch

    if rows < 1:
        raise ValueError(f"roofline rows={rows}: must be >= 1 (the tokens of one engine step)")
    dt = getattr(torch, dtype, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"roofline dtype={dtype!r}: not a torch dtype; use float32, bfloat16 or float16")
    g = torch.Generator().manual_seed(0)
    gemms = shapes.gemms()
    flops = time_s = 0.0
    t_start = time.perf_counter()
    with torch.inference_mode():
        for name, (i, o) in gemms.items():
            x, w = torch.randn(rows, i, generator=g).to(dt), torch.randn(i, o, generator=g).to(dt)
            if not flops:
                x @ w  # warm-up of the first shape: thread pool, kernels, allocator
            calls, t0 = 0, time.perf_counter()
            while True:
                x @ w
                calls += 1
                elapsed = time.perf_counter() - t0
                if elapsed >= seconds / len(gemms):
                    break
            weight = 1 if name == "lm_head" else shapes.layers
            flops += weight * 2.0 * rows * i * o
            time_s += weight * elapsed / calls
    return {"gflops": flops / time_s / 1e9, "rows": rows, "dtype": dtype, "threads": torch.get_num_threads(),
            "seconds": round(time.perf_counter() - t_start, 3)}


def roofline_fraction(flops: float, seconds: float, gflops: float) -> float:
    """Achieved FLOP/s over the measured GEMM rate (0..1 normally); NaN when time or rate is not positive."""
    if seconds <= 0 or gflops <= 0 or not math.isfinite(gflops):
        return float("nan")
    return flops / seconds / (gflops * 1e9)


def limit_tokens_per_s(shapes: ModelShapes, gflops: float, prompt_tokens: int, completion_tokens: int) -> float:
    """Completion tokens per second if the call ran at exactly the GEMM rate (same prompt/completion mix)."""
    flops = generation_flops(shapes, prompt_tokens, completion_tokens)
    return completion_tokens * gflops * 1e9 / flops if flops > 0 else float("nan")


def prompt_tokens(tokenizer, prompts: list[str]) -> int:
    """Tokens in ``prompts`` (chat-templated strings, no special tokens added: the template has them)."""
    return sum(len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"])


@dataclass(frozen=True)
class GemmLimit:
    """A measured GEMM rate with the shapes it was measured on: what a run keeps to price each generation."""

    shapes: ModelShapes
    gflops: float

    @classmethod
    def measure(cls, shapes: ModelShapes, rows: int, dtype: str, seconds: float = 1.0) -> GemmLimit:
        """:func:`gemm_rate` now, in this process."""
        return cls(shapes, gemm_rate(shapes, rows, dtype, seconds)["gflops"])

    def fraction(self, prompt_tokens: int, completion_tokens: int, seconds: float) -> float:
        """The generate call's achieved GEMM FLOP/s over the limit (:func:`roofline_fraction`)."""
        return roofline_fraction(generation_flops(self.shapes, prompt_tokens, completion_tokens), seconds,
                                 self.gflops)
