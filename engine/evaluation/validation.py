"""Held-out validation: greedy rewards of several adapters on the task's held-out problems, one batch.

``essa train`` and ``essa grpo`` validate with this one function on their own engine, so their
accuracies come from the same code, decoding and reward (docs/ARCHITECTURE.md).
"""
from __future__ import annotations

from typing import Sequence

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
