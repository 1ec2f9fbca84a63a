"""Symbolic check with HF math-verify, run only inside pool workers (`rewards._pool`).

math-verify (https://github.com/huggingface/Math-Verify) parses LaTeX with
latex2sympy2_extended and compares with sympy (numeric, symbolic, sets, intervals,
matrices, relations). Its own time limits use ``signal.alarm``, which works only in the main
thread of the main interpreter; they are switched off here (``parsing_timeout=None``,
``timeout_seconds=None``) and the pool kills a worker that overruns instead.

Only `LatexExtractionConfig` is used: `ExprExtractionConfig` goes through sympy's
``parse_expr``, which calls Python's ``eval``. Both sides are wrapped in ``\\boxed{...}`` so
that math-verify parses exactly the answer the caller extracted.

Importing this module imports sympy (about a second); the parent process never does.
"""

from __future__ import annotations

import logging
from functools import lru_cache

from math_verify import LatexExtractionConfig, parse, verify

for _name in ("math_verify", "latex2sympy2_extended"):
    logging.getLogger(_name).setLevel(logging.CRITICAL)

_CONFIG = [LatexExtractionConfig(boxed_match_priority=0)]


def _parse(answer: str) -> list:
    return parse(
        "\\boxed{" + answer + "}",
        extraction_config=_CONFIG,
        fallback_mode="first_match",
        parsing_timeout=None,  # type: ignore[arg-type]  # None disables the signal alarm
    )


@lru_cache(maxsize=4096)
def _parse_reference(ref: str) -> tuple:
    return tuple(_parse(ref))


def verify_pair(pred: str, ref: str) -> str:
    """Compare one extracted answer with one reference.

    Returns:
        ``"correct"``, ``"wrong"`` or ``"ref_error"`` (math-verify cannot turn the reference
        into a sympy object, so nothing could be scored against it, not even an identical
        string). Runs without a time limit: call it only in a pool worker.
    """
    gold = _parse_reference(ref)
    if not any(not isinstance(g, str) for g in gold):
        return "ref_error"
    target = _parse(pred)
    if not target:
        return "wrong"
    ok = verify(list(gold), target, timeout_seconds=None)
    return "correct" if ok else "wrong"
