"""Math correctness reward: extraction (`rewards.extract`), a fast exact path for plain numbers
and text (`rewards.numeric`), and HF math-verify in a hard-timeout process pool
(`rewards._pool`) for everything else.

Scoring of one completion against one reference:

==============  ===========================================================  ==========
status          when                                                         reward
==============  ===========================================================  ==========
``correct``     every distinct final answer equals the reference             1 (+ fmt)
``wrong``       an answer differs, hedges ("12 or 15"), is ambiguous, or     0 (+ fmt)
                is longer than ``max(1000, 4 * len(reference))`` characters
``no_answer``   nothing extracted (includes truncated ``\\boxed{``/think)      0
``timeout``     the symbolic check hit its hard time limit, or its worker    0 (+ fmt)
                died while checking it (a completion-made problem)
``error``       the reference is empty, not a string, or unparseable, the    NaN
                completion is not a string, or no checker process starts
==============  ===========================================================  ==========

``fmt`` is ``format_weight`` when the answer came from exactly one distinct ``\\boxed{}``,
else 0 (the format reward of DeepSeek-R1, arXiv 2501.12948, kept as a separate term).
``error`` is NaN, never 0: a reward that cannot score must not look like a wrong answer
(docs/ARCHITECTURE.md), and strategies rank NaN last.

Several distinct boxes are checked one by one and the row is ``correct`` only if all are:
listing candidates never pays, equivalent rewrites (``\\frac12`` then ``0.5``) still do.
The exception is a reference that is itself a list (`list_reference`): ``3, 5, 7`` or
``\\{3, 5, 7\\}`` (a set: the boxes must be its items in any order, none missing, none
extra) or ``(2, 3)`` (a sequence: the boxes in that order); the boxes are then scored
together as one list.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rewards import _pool
from rewards.extract import extract, is_hedged, reference_answer
from rewards.numeric import Number, numbers_equal, parse_number, text_key, text_reference

Status = Literal["correct", "wrong", "no_answer", "timeout", "error"]

MAX_DISTINCT_BOXES = 8  # more distinct boxed answers than this is scored wrong unchecked
_CACHE_SIZE = 1 << 16


@dataclass(frozen=True)
class RewardResult:
    """The score of one completion.

    Attributes:
        reward: 1.0 correct / 0.0 otherwise, plus the weighted format term; NaN for ``error``.
        extracted: the final answer found (several boxes joined by `` | ``), or None.
        status: ``correct``, ``wrong``, ``no_answer``, ``timeout`` or ``error``.
    """

    reward: float
    extracted: str | None
    status: Status


# (pred, ref) -> (status, timeout_s it was obtained under); shared by all instances in a process.
_SLOW_CACHE: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
_SLOW_LOCK = threading.Lock()


def _cache_get(key: tuple[str, str], timeout_s: float) -> str | None:
    with _SLOW_LOCK:
        hit = _SLOW_CACHE.get(key)
        if hit is None:
            return None
        status, limit = hit
        if status == "timeout" and limit < timeout_s:
            return None  # might finish under the longer limit
        _SLOW_CACHE.move_to_end(key)
        return status


def _cache_put(key: tuple[str, str], status: str, timeout_s: float) -> None:
    if status == "error":
        return  # infrastructure failure: try again next time
    with _SLOW_LOCK:
        _SLOW_CACHE[key] = (status, timeout_s)
        _SLOW_CACHE.move_to_end(key)
        while len(_SLOW_CACHE) > _CACHE_SIZE:
            _SLOW_CACHE.popitem(last=False)


def _fast(answer: str, ref: str) -> str | None:
    """``"correct"``/``"wrong"`` when decidable without sympy, else None."""
    if is_hedged(answer) and not is_hedged(ref):
        return "wrong"
    if len(answer) > max(1000, 4 * len(ref)):
        return "wrong"
    key = text_reference(ref)
    if key is not None:
        return "correct" if text_key(answer) == key else "wrong"
    ref_num = parse_number(ref)
    if ref_num is not None:
        pred_num = parse_number(answer)
        if pred_num is not None:
            return "correct" if numbers_equal(ref_num, pred_num) else "wrong"
    return None


def _split_top(s: str) -> list[str]:
    """`s` split at commas outside braces (``\\{ \\}`` too), brackets and parentheses."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            depth += {"{": 1, "}": -1}.get(s[i + 1:i + 2], 0)
            i += 2
            continue
        if c in "{[(":
            depth += 1
        elif c in "}])":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(s[start:i].strip())
            start = i + 1
        i += 1
    parts.append(s[start:].strip())
    return parts


def list_reference(ref: str) -> tuple[Literal["set", "sequence"], str, str, list[str]] | None:
    """Read a reference as a list of several items, or None.

    ``3, 5, 7`` and ``\\{3, 5, 7\\}`` are sets, ``(2, 3)`` a sequence; a number (``1,000``),
    an interval with a bracket (``[0, 1)``), a hedge or a single item is not a list.

    Returns:
        ``(kind, open, close, items)``: the delimiters to rebuild the list with.
    """
    s = ref.strip()
    if len(s) > 1000 or parse_number(s) is not None or is_hedged(s):
        return None
    kind: Literal["set", "sequence"] = "set"
    left = right = ""
    if s.startswith("\\{") and s.endswith("\\}"):
        left, right, s = "\\{", "\\}", s[2:-2]
    elif s.startswith("(") and s.endswith(")") and len(_split_top(s[1:-1])) > 1 and _split_top(s)[0] == s:
        kind, left, right, s = "sequence", "(", ")", s[1:-1]
    items = _split_top(s)
    if len(items) < 2 or not all(items):
        return None
    return kind, left, right, items


def _numbers_match(kind: str, items: list[Number], answers: list[Number]) -> bool:
    """Every item matched by exactly one answer (a set), or item i by answer i (a sequence)."""
    if len(items) != len(answers):
        return False
    if kind == "sequence":
        return all(numbers_equal(a, b) for a, b in zip(items, answers))
    free = list(answers)
    for item in items:
        hit = next((k for k, a in enumerate(free) if numbers_equal(item, a)), None)
        if hit is None:
            return False
        free.pop(hit)
    return True


def _list_answer(answers: tuple[str, ...], ref: str) -> tuple[str | None, str | None]:
    """Several boxes against a list reference: ``(status, None)`` when decided here,
    ``(None, joined)`` when the joined list must go to math-verify, ``(None, None)`` when the
    reference is not a list (the boxes are then scored one by one)."""
    parsed = list_reference(ref)
    if parsed is None:
        return None, None
    kind, left, right, items = parsed
    if any(is_hedged(a) for a in answers):
        return "wrong", None
    ref_nums = [parse_number(i) for i in items]
    ans_nums = [parse_number(a) for a in answers]
    if all(n is not None for n in ref_nums + ans_nums):
        distinct: list[Number] = []
        for n in ans_nums:  # `3` and `3.0` boxed: one answer
            if kind == "sequence" or not any(numbers_equal(d, n) for d in distinct):
                distinct.append(n)  # type: ignore[arg-type]
        return ("correct" if _numbers_match(kind, ref_nums, distinct) else "wrong"), None  # type: ignore[arg-type]
    return None, left + ", ".join(answers) + right


def _combine(statuses: list[str]) -> Status:
    """Row status from its answers' statuses: all must be correct."""
    for s, out in (("ref_error", "error"), ("wrong", "wrong"), ("error", "error"), ("timeout", "timeout")):
        if s in statuses:
            return out  # type: ignore[return-value]
    return "correct"


def check_scoring_options(timeout_s: float, format_weight: float, workers: int) -> None:
    """The options every reward scored in the worker pool shares (MathReward, GymReward).

    Raises:
        ValueError: ``timeout_s`` not > 0 seconds, ``format_weight`` not finite, or ``workers`` < 1.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    if not math.isfinite(format_weight):
        raise ValueError(f"format_weight must be finite, got {format_weight}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")


class MathReward:
    """Batched math correctness reward (picklable: it holds settings only).

    Args:
        lenient: also accept the last bare number of a completion (off by default; see
            `rewards.extract`).
        timeout_s: limit in seconds of CPU time for one symbolic check (> 0; a wall-clock backstop of 10x
            ends a check that hangs without using CPU). Plain numbers and text
            answers never need one.
        format_weight: weight of the format term (1 when the answer is in exactly one
            distinct ``\\boxed{}``); 0 disables it.
        workers: processes in the math-verify pool (started on first need, shared by all
            instances with the same settings).
        memory_limit_bytes: address-space cap per worker process (None: no cap).

    Raises:
        ValueError: `timeout_s` <= 0, `format_weight` not finite, or `workers` < 1.
    """

    def __init__(
        self,
        lenient: bool = False,
        timeout_s: float = 5.0,
        format_weight: float = 0.0,
        workers: int = 2,
        memory_limit_bytes: int | None = 4 << 30,
    ):
        check_scoring_options(timeout_s, format_weight, workers)
        self.lenient = lenient
        self.timeout_s = float(timeout_s)
        self.format_weight = float(format_weight)
        self.workers = workers
        self.memory_limit_bytes = memory_limit_bytes

    def __repr__(self) -> str:
        return (
            f"MathReward(lenient={self.lenient}, timeout_s={self.timeout_s}, "
            f"format_weight={self.format_weight}, workers={self.workers})"
        )

    def __call__(self, completions: Sequence[str], references: Sequence[str]) -> list[RewardResult]:
        """Score ``completions[i]`` against ``references[i]``.

        Args:
            completions: N completion texts.
            references: N reference answers (plain answers, or worked solutions ending in a
                box or ``#### N``).

        Returns:
            N `RewardResult`, in input order. Never raises for bad rows: they get status
            ``error`` (reward NaN). Wall time is bounded by about
            ``timeout_s * (slow rows) / workers`` plus worker start-up on first use.

        Raises:
            ValueError: the two sequences differ in length.
        """
        if len(completions) != len(references):
            raise ValueError(
                f"got {len(completions)} completions but {len(references)} references; "
                "pass one reference per completion"
            )
        out: list[RewardResult | None] = [None] * len(completions)
        # Rows that need the pool: row -> (extracted text, format term, per-answer statuses)
        open_rows: dict[int, tuple[str | None, float, list[str | None]]] = {}
        slow: dict[tuple[str, str], list[tuple[int, int]]] = {}
        for i, (completion, raw_ref) in enumerate(zip(completions, references)):
            decided = self._decide(i, completion, raw_ref, slow)
            if isinstance(decided, RewardResult):
                out[i] = decided
            else:
                open_rows[i] = decided
        if slow:
            keys = list(slow)
            pool = _pool.get_pool(self.workers, self.memory_limit_bytes)
            for key, status in zip(keys, pool.map(keys, self.timeout_s)):
                _cache_put(key, status, self.timeout_s)
                for i, j in slow[key]:
                    open_rows[i][2][j] = status
        for i, (text, fmt, statuses) in open_rows.items():
            out[i] = self._result(text, fmt, statuses)  # type: ignore[arg-type]
        return out  # type: ignore[return-value]

    def _decide(self, i: int, completion, raw_ref, slow: dict) -> RewardResult | tuple:
        """Row ``i``'s result when it is decided without the worker pool; else ``(extracted text, format
        term, per-answer statuses with None for the answers queued in ``slow`` for the pool)``."""
        nan = float("nan")
        if not isinstance(completion, str) or not isinstance(raw_ref, str):
            return RewardResult(nan, None, "error")
        ref = reference_answer(raw_ref)
        if not ref:
            return RewardResult(nan, None, "error")
        ex = extract(completion, self.lenient)
        if not ex.answers:
            return RewardResult(0.0, None, "no_answer")
        fmt = self.format_weight if ex.source == "boxed" and len(ex.answers) == 1 else 0.0
        if ex.ambiguous or len(ex.answers) > MAX_DISTINCT_BOXES:
            return RewardResult(fmt, ex.text, "wrong")
        answers = ex.answers
        if len(answers) > 1:
            decided, joined = _list_answer(answers, ref)
            if decided is not None:
                return RewardResult(fmt + (decided == "correct"), ex.text, decided)  # type: ignore[arg-type]
            if joined is not None:
                answers = (joined,)
        statuses: list[str | None] = []
        for j, answer in enumerate(answers):
            status = _fast(answer, ref)
            if status is None:
                status = _cache_get((answer, ref), self.timeout_s)
            if status is None:
                slow.setdefault((answer, ref), []).append((i, j))
            statuses.append(status)
        if any(s is None for s in statuses):
            return ex.text, fmt, statuses
        return self._result(ex.text, fmt, statuses)  # type: ignore[arg-type]

    @staticmethod
    def _result(text: str | None, fmt: float, statuses: list[str]) -> RewardResult:
        status = _combine(statuses)
        if status == "error":
            return RewardResult(float("nan"), text, "error")
        return RewardResult((1.0 if status == "correct" else 0.0) + fmt, text, status)


def reward(
    completions: Sequence[str],
    references: Sequence[str],
    *,
    lenient: bool = False,
    timeout_s: float = 5.0,
    format_weight: float = 0.0,
) -> list[RewardResult]:
    """Score completions against references; ``MathReward(...)(completions, references)``.

    Args:
        completions: N completion texts.
        references: N reference answers.
        lenient: accept the last bare number when no answer marker is present.
        timeout_s: hard limit in seconds per symbolic check.
        format_weight: weight of the "answer is boxed" term added to the reward.

    Returns:
        N `RewardResult` in input order (see `MathReward.__call__`).

    Raises:
        ValueError: length mismatch or invalid settings.
    """
    return MathReward(lenient=lenient, timeout_s=timeout_s, format_weight=format_weight)(completions, references)
