"""Held-out validation: greedy rewards of several adapters on the task's held-out problems, one batch.

``essa train`` and ``essa grpo`` validate with this one function on their own engine, so their
accuracies come from the same code, decoding and reward (docs/ARCHITECTURE.md).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from engine.backends import AdapterRef, Sampling
from engine.tasks import Problem


def held_out_rewards(evaluator, conditions: dict[str, AdapterRef | None], problems: Sequence[Problem],
                     max_tokens: int, seed: int) -> dict[str, np.ndarray]:
    """Greedy held-out rewards of each condition (an adapter, or None = the base model), in one
    ``evaluator.score`` call, so every condition shares the engine call (bf16 greedy decoding drifts
    between calls; a paired test needs its two sides from one call).

    Args:
        evaluator: a population evaluator (engine/evaluation/population.py or ray_population.py).
        conditions: condition name -> adapter.
        problems: the N held-out problems.
        max_tokens: new tokens per answer. seed: the sampling seed (unused by greedy decoding).

    Returns:
        ``{condition: (N,) float64}`` reward per problem in ``problems`` order; NaN = could not be
        scored (accuracy counts it as wrong). Per-problem results let two conditions be compared on
        the same problems (engine/results/stats.py).
    """
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0, n=1, seed=seed)
    names = list(conditions)
    rewards, *_ = evaluator.score([conditions[k] for k in names], problems, sampling)
    return {k: rewards[i].reshape(len(problems), -1).mean(axis=1) for i, k in enumerate(names)}


def adapter_digest(path: str | Path | None) -> str | None:
    """A content hash (20 hex chars) of a PEFT adapter directory's weights and config, for cache keys that
    must change when the adapter does; None for no adapter (the base model).

    Raises:
        FileNotFoundError: no ``adapter_model.safetensors`` in ``path``.
    """
    if path is None:
        return None
    h = hashlib.sha256((Path(path) / "adapter_model.safetensors").read_bytes())
    config = Path(path) / "adapter_config.json"
    if config.exists():
        h.update(config.read_bytes())
    return h.hexdigest()[:20]


def cached_json(cache_dir: Path, key: dict, compute: Callable[[], dict]) -> tuple[dict, bool]:
    """A JSON-able result that does not change between runs, read from ``cache_dir`` when a run with the
    same ``key`` computed it, else computed and written there (atomically).

    Args:
        cache_dir: directory of the cache files (under ``$ESSA_CACHE``).
        key: JSON-able fields that decide the result (model, dtype, problems, max_tokens, ...).
        compute: ``() -> dict | None`` (JSON-able), called on a miss; None means "not now" (nothing written).

    Returns:
        (the result, whether it came from the cache); (None, False) when ``compute`` declined. An unreadable
        cache file is recomputed and replaced.
    """
    from engine import io

    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    path = Path(cache_dir) / f"{digest}.json"
    try:
        stored = io.read_json(path)
        if stored.get("key") == json.loads(json.dumps(key, default=str)) and isinstance(stored["value"], dict):
            return stored["value"], True
    except (FileNotFoundError, ValueError, AttributeError, KeyError):
        pass
    value = compute()
    if value is not None:
        io.write_json(path, {"key": key, "value": value})
    return value, False


def cached_rewards(cache_dir: Path, key: dict,
                   compute: Callable[[], dict[str, np.ndarray] | None]) -> tuple[dict | None, bool]:
    """Held-out rewards that do not change between runs (the base model's, for one model, dtype, task
    and decoding) through :func:`cached_json`: ``({condition: (N,) float64}, from the cache)``, or
    ``(None, False)`` on a miss where ``compute`` returns None (look up only)."""
    def as_lists() -> dict | None:
        got = compute()
        return None if got is None else {c: [float(x) for x in r] for c, r in got.items()}

    value, hit = cached_json(cache_dir, key, as_lists)
    return (None if value is None else {c: np.asarray(r, dtype=float) for c, r in value.items()}), hit
