"""Reward of a reasoning-gym task: the answer extracted from a completion, scored by the dataset's own
verifier (``score_answer``), with `rewards.MathReward`'s call signature, statuses and time limits.

Scoring of one completion against one reference:

==============  ===========================================================  ==========
status          when                                                         reward
==============  ===========================================================  ==========
``correct``     the verifier scores the extracted answer 1.0                 1 (+ fmt)
``wrong``       it scores less (reasoning-gym's partial credit, e.g.         0 (+ fmt)
                countdown's 0.05 for the right numbers and a wrong value,
                is not paid: fitness and held-out accuracy stay the
                fraction solved), several distinct boxed answers, or an
                answer tag holding more than digits, ``+ - * / ( )`` and
                spaces (``answer_tag``: never handed to the verifier)
``no_answer``   nothing extracted (no box, no closed answer tag)             0
``timeout``     the verifier hit its hard time limit, or its worker died     0 (+ fmt)
``error``       the reference is empty or not one the dataset generates,     NaN
                the completion is not a string, or no worker process starts
==============  ===========================================================  ==========

Answer formats (``answer_format``):

* ``boxed``: the project's format: the answer is the one distinct ``\\boxed{}`` of the completion
  (`rewards.extract`, strict; ``lenient`` also takes the last bare number); ``fmt`` is
  ``format_weight`` when it came from exactly one distinct box, as in `rewards.MathReward`.
* ``answer_tag``: ES-at-Scale's countdown format (Qiu et al., arXiv 2509.24372, after TinyZero):
  the answer is the content of the *last* ``<answer>...</answer>``; ``fmt`` is ``format_weight``
  times their format score: 1.0 when the completion is exactly ``<think>...</think>\\n<answer>...</answer>``,
  else 0.1 when it has a ``<think>...</think>`` plus 0.5 when it has an ``<answer>...</answer>``.

The verifier runs in worker processes (`rewards._pool`, kind ``gym``): some evaluate the answer
(countdown: sympy's ``parse_expr``, which uses ``eval``), so a hostile or huge expression
(``9**9**9**9``) costs one worker and ``timeout_s`` seconds, never the run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rewards import _pool
from rewards.extract import extract
from rewards.math_reward import RewardResult, check_scoring_options

ANSWER_FORMATS = ("boxed", "answer_tag")
_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_FULL = re.compile(r"^<think>.*?</think>\n<answer>.*?</answer>$", re.DOTALL)
_EXPRESSION = re.compile(r"^[0-9+\-*/() ]+$")  # ES-at-Scale's allowed characters of a countdown answer


def tag_format_score(completion: str) -> float:
    """ES-at-Scale's format score of a completion: 1.0 for exactly ``<think>...</think>\\n<answer>...</answer>``
    (trailing whitespace ignored), else 0.1 for a ``<think>...</think>`` plus 0.5 for an ``<answer>...</answer>``."""
    text = completion.rstrip()
    if _FULL.match(text):
        return 1.0
    return 0.1 * bool(_THINK.search(text)) + 0.5 * bool(_TAG.search(text))


def tag_answer(completion: str) -> str | None:
    """The stripped content of the last ``<answer>...</answer>``, or None when there is none (or it is empty)."""
    found = _TAG.findall(completion)
    return (found[-1].strip() or None) if found else None


class GymReward:
    """Batched reward of a reasoning-gym dataset (picklable: it holds settings only).

    Args:
        dataset: the reasoning-gym dataset name (``countdown``, ``basic_arithmetic``, ``chain_sum``,
            ``gsm_symbolic``, ...), whose ``score_answer`` decides.
        answer_format: ``boxed`` or ``answer_tag`` (module docstring).
        lenient: ``boxed`` only: also accept the last bare number (`rewards.extract`).
        timeout_s: limit in seconds of CPU time for one verifier call (> 0; a wall-clock backstop of 10x
            ends a call that hangs without using CPU).
        format_weight: weight of the format term; 0 disables it.
        workers: processes in the verifier pool (started on first need, shared by every instance
            with the same settings).
        memory_limit_bytes: address-space cap per worker process (None: no cap).

    Raises:
        ValueError: an empty dataset name, an unknown answer format, ``timeout_s`` <= 0,
            ``format_weight`` not finite, or ``workers`` < 1.
    """

    def __init__(self, dataset: str, answer_format: str = "boxed", lenient: bool = False, timeout_s: float = 5.0,
                 format_weight: float = 0.0, workers: int = 2, memory_limit_bytes: int | None = 4 << 30):
        if not isinstance(dataset, str) or not dataset:
            raise ValueError(f"dataset must name a reasoning-gym dataset, got {dataset!r}")
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
        check_scoring_options(timeout_s, format_weight, workers)
        self.dataset, self.answer_format, self.lenient = dataset, answer_format, lenient
        self.timeout_s, self.format_weight = float(timeout_s), float(format_weight)
        self.workers, self.memory_limit_bytes = workers, memory_limit_bytes

    def __repr__(self) -> str:
        return (f"GymReward(dataset={self.dataset!r}, answer_format={self.answer_format!r}, lenient={self.lenient}, "
                f"timeout_s={self.timeout_s}, format_weight={self.format_weight}, workers={self.workers})")

    def answer_of(self, completion: str) -> tuple[str | None, float, bool]:
        """(the answer handed to the verifier or None, the format term, whether the answer is refused
        unchecked: several distinct boxes, or a tag answer with characters outside ``0-9 + - * / ( )``)."""
        if self.answer_format == "answer_tag":
            answer = tag_answer(completion)
            fmt = self.format_weight * tag_format_score(completion)
            return answer, fmt, answer is not None and not _EXPRESSION.match(answer)
        ex = extract(completion, self.lenient)
        fmt = self.format_weight if ex.source == "boxed" and len(ex.answers) == 1 else 0.0
        if not ex.answers:
            return None, 0.0, False
        return ex.text, fmt, ex.ambiguous or len(ex.answers) > 1

    def __call__(self, completions: Sequence[str], references: Sequence[str]) -> list[RewardResult]:
        """Score ``completions[i]`` against ``references[i]`` (the dataset's reference answers,
        ``engine.tasks.Problem.answer``).

        Returns:
            N `RewardResult`, in input order; never raises for bad rows (status ``error``, reward NaN).
            Wall time is bounded by about ``timeout_s * N / workers`` plus worker start-up on first use.

        Raises:
            ValueError: the two sequences differ in length.
        """
        if len(completions) != len(references):
            raise ValueError(f"got {len(completions)} completions but {len(references)} references; "
                             "pass one reference per completion")
        nan = float("nan")
        out: list[RewardResult | None] = [None] * len(completions)
        queued: list[tuple[int, str, float]] = []  # (row, answer, format term)
        for i, (completion, ref) in enumerate(zip(completions, references)):
            if not isinstance(completion, str) or not isinstance(ref, str) or not ref.strip():
                out[i] = RewardResult(nan, None, "error")
                continue
            answer, fmt, refused = self.answer_of(completion)
            if answer is None:
                out[i] = RewardResult(0.0, None, "no_answer")
            elif refused:
                out[i] = RewardResult(fmt, answer, "wrong")
            else:
                queued.append((i, answer, fmt))
        if queued:
            pool = _pool.get_pool(self.workers, self.memory_limit_bytes, kind="gym")
            items = [(answer, self.dataset, references[i]) for i, answer, _ in queued]
            for (i, answer, fmt), result in zip(queued, pool.map(items, self.timeout_s)):
                out[i] = _result(answer, fmt, result)
        return out  # type: ignore[return-value]


def _result(answer: str, fmt: float, result) -> RewardResult:
    """One row's RewardResult from the pool's result: a score, or a status string."""
    if isinstance(result, float):
        correct = result >= 1.0
        return RewardResult((1.0 if correct else 0.0) + fmt, answer, "correct" if correct else "wrong")
    if result == "timeout":
        return RewardResult(fmt, answer, "timeout")
    if result == "wrong":  # the worker caught an exception the verifier did not
        return RewardResult(fmt, answer, "wrong")
    return RewardResult(float("nan"), answer, "error")  # ref_error, error
