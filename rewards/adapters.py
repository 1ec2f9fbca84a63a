"""Adapters to the reward signatures the field already uses.

- TRL (``trl/rewards/accuracy_rewards.py``, GRPOTrainer ``reward_funcs``): a batched plain
  function ``f(completions, **kwargs) -> list[float | None]`` where dataset columns arrive
  as keyword lists and ``None`` means "cannot score" (TRL turns it into NaN and skips it).
  Completions are strings, or in conversational form a list of message dicts per row.
- verl (``verl/utils/reward_score/__init__.py``, ``default_compute_score``): one row at a
  time, ``compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float``.
"""

from __future__ import annotations

from typing import Any

from rewards.gym_reward import GymReward
from rewards.math_reward import MathReward


def _completion_text(completion: Any) -> str | None:
    """Text of a TRL completion: a str, or the last assistant message of a conversation."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)) and completion:
        messages = [m for m in completion if isinstance(m, dict)]
        assistant = [m for m in messages if m.get("role") == "assistant"] or messages
        if not assistant:
            return None
        content = assistant[-1].get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):  # multimodal parts: [{"type": "text", "text": ...}]
            return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return None


class TrlMathReward(MathReward):
    """`MathReward` with TRL's reward-function signature (picklable, has ``__name__``).

    ``TrlMathReward(format_weight=0.1)`` configures it like `MathReward`; pass the instance
    in ``GRPOTrainer(reward_funcs=[...])``. See `trl_math_reward` for the call contract.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.__name__ = "math_reward"

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float | None]:  # type: ignore[override]
        return _trl_scores(MathReward.__call__, self, completions, kwargs)


class TrlGymReward(GymReward):
    """`GymReward` with TRL's reward-function signature (picklable, has ``__name__``): the call
    contract of `trl_math_reward`, the reference in the ``answer`` (or ``solution``) column."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.__name__ = f"{self.dataset}_reward"

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float | None]:  # type: ignore[override]
        return _trl_scores(GymReward.__call__, self, completions, kwargs)


def _trl_scores(score, reward, completions: list[Any], columns: dict) -> list[float | None]:
    """TRL's call of a batched reward: the reference column (``answer``, else ``solution``), the
    completions' texts, ``score(reward, texts, refs)``; None where the row cannot be scored.

    Raises:
        KeyError: neither column is given.
    """
    refs = columns.get("answer")
    if refs is None:
        refs = columns.get("solution")
    if refs is None:
        raise KeyError(
            f"{reward.__name__} needs the reference answers in a dataset column named 'answer' or 'solution'; "
            f"got columns {sorted(columns)}"
        )
    texts = [_completion_text(c) for c in completions]
    refs = [r if isinstance(r, str) or r is None else str(r) for r in refs]
    results = score(reward, texts, refs)
    return [None if r.status == "error" else r.reward for r in results]


def trl_math_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """TRL reward function: 1.0 for a correct final answer, 0.0 otherwise, None if unscorable.

    Args:
        completions: N completions, each a string or a conversation (list of
            ``{"role", "content"}`` dicts; the last assistant message is scored).
        **kwargs: dataset columns from TRL; the reference is ``answer`` (preferred) or
            ``solution`` (a worked solution is reduced to its last box or ``#### N``).
            Other columns (``prompts``, ``completion_ids``, ``trainer_state`` ...) are ignored.

    Returns:
        N floats, or None for a row whose reference is missing or unparseable.

    Raises:
        KeyError: neither ``answer`` nor ``solution`` is given.
        ValueError: the reference column's length differs from ``completions``.
    """
    return _DEFAULT_TRL(completions, **kwargs)


_DEFAULT_TRL = TrlMathReward()


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    """verl custom reward function (``custom_reward_function.name=compute_score``).

    Args:
        data_source: dataset name (unused: every source is scored as math).
        solution_str: the decoded completion.
        ground_truth: the reference answer (str or number); a list/tuple means "any of these".
        extra_info: unused.

    Returns:
        1.0 correct, 0.0 wrong / no answer / timeout, NaN when the reference cannot be
        scored (never a silent 0; filter or fix such rows).
    """
    del data_source, extra_info
    refs = list(ground_truth) if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    refs = [r if isinstance(r, str) else str(r) for r in refs]
    if not refs:
        return float("nan")
    scores = [r.reward for r in _DEFAULT_VERL([solution_str] * len(refs), refs)]
    finite = [s for s in scores if s == s]
    return max(finite) if finite else float("nan")


_DEFAULT_VERL = MathReward()
