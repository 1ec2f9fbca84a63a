"""Symbolic check with HF math-verify, run only inside pool workers (`rewards._pool`).

math-verify (https://github.com/huggingface/Math-Verify) parses LaTeX with
latex2sympy2_extended and compares with sympy (numeric, symbolic, sets, intervals,
matrices, relations). Its own time limits use ``signal.alarm``, which works only in the main
thread of the main interpreter; they are switched off here (``parsing_timeout=None``,
``timeout_seconds=None``) and the pool kills a worker that overruns instead.

Only `LatexExtractionConfig` is used: `ExprExtractionConfig` goes through sympy's
``parse_expr``, which calls Python's ``eval``. Both sides are wrapped in ``\\boxed{...}`` so
that math-verify parses exactly the answer the caller extracted.

Three rules are added around math-verify's ``verify``:

- an equation is compared as an equation. math-verify compares an equation answer with a
  non-equation reference by its right side only (``5 = 12`` and ``3x + 4y = 12`` both
  "equal" ``12``); here that is allowed only for an assignment (``x = 12``) or a true
  identity between numbers (``3 \\times 4 = 12``). Two equations are compared by math-verify
  (both sides; equal up to a nonzero factor, or the same solutions);
- an inequality answer is compared with an interval reference as the set it defines
  (``allow_set_relation_comp``: ``x > 3`` is ``(3, \\infty)``);
- two plain numbers math-verify calls equal must also agree to a relative 1e-6
  (math-verify rounds to 6 decimal places, so ``2^{-98}`` would "equal" ``2^{-99}``),
  except with a percent sign, where math-verify's own ``25\\% = 25`` rule stands.

Importing this module imports sympy (about a second); the parent process never does.
"""

from __future__ import annotations

import logging
from functools import lru_cache

import sympy
from math_verify import LatexExtractionConfig, parse, verify
from math_verify.grader import is_assignment_relation, is_equation, is_relation

for _name in ("math_verify", "latex2sympy2_extended"):
    logging.getLogger(_name).setLevel(logging.CRITICAL)

_CONFIG = [LatexExtractionConfig(boxed_match_priority=0)]
_RTOL = sympy.Rational(1, 10**6)  # as rewards.numeric


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
    g0 = next(g for g in gold if not isinstance(g, str))
    t0 = next((t for t in target if not isinstance(t, str)), None)
    if t0 is not None and not _equation_allowed(g0, t0):
        return "wrong"
    ok = verify(list(gold), target, timeout_seconds=None, allow_set_relation_comp=True)
    if ok and t0 is not None and "%" not in pred + ref and not _relatively_close(g0, t0):
        return "wrong"
    return "correct" if ok else "wrong"


def _equation_allowed(gold, pred) -> bool:
    """False when an equation would be compared with a non-equation by one side only."""
    for eq, other in ((pred, gold), (gold, pred)):
        if not is_equation(eq) or is_relation(other) or is_assignment_relation(eq):
            continue
        # Only a chain of true identities between numbers (`3 \times 4 = 12`) may stand for its value.
        rels = eq.args if isinstance(eq, sympy.And) else (eq,)
        for r in rels:
            diff = r.lhs - r.rhs
            if diff.free_symbols or not diff.is_number or sympy.simplify(diff) != 0:
                return False
    return True


def _relatively_close(gold, pred) -> bool:
    """True unless both are plain numbers that differ by more than 1e-6 relative."""
    if not (isinstance(gold, sympy.Expr) and isinstance(pred, sympy.Expr)):
        return True
    if not (gold.is_number and pred.is_number):
        return True
    a, b = gold.evalf(30), pred.evalf(30)
    if not (a.is_real and b.is_real and a.is_finite and b.is_finite):
        return True
    return bool(abs(a - b) <= _RTOL * max(abs(a), abs(b)))
