"""Fast exact path: plain numbers and short text answers, without sympy or a process pool.

Most answers in GSM8K-style training are plain numbers written in many ways; deciding those
here keeps 10,000 completions well under a second. The normalisations follow the answer
normalisers used by the MATH benchmark (Hendrycks et al. 2021, arXiv 2103.03874,
``is_equiv``/``strip_string``) and by Minerva (Lewkowycz et al. 2022, arXiv 2206.14858,
``normalize_final_answer``): thousands separators (``1,000``, ``10,\\!080``, ``1{,}000``),
currency (``$``, ``\\$``, ``USD``), trailing ``.00``, ``%``, ``\\text{...}`` wrappers and unit
words, degrees, ordinal suffixes (``12th``, ``12^{\\text{th}}``), ``\\dfrac``/``\\frac``/``a/b``/
decimals, mixed numbers (``1 1/4``, ``2\\frac{3}{4}``: a whole number and a proper fraction),
leading zeros, assignments ``x = 5`` (the left side one variable; any other equation is left to
math-verify, which compares both sides), scientific notation with a bounded exponent,
"5 million".

Comparison (`numbers_equal`): exact rational equality; when either side is written as a
decimal, a relative tolerance of 1e-6 (so ``1e-7`` and ``2e-7`` differ at any magnitude),
and for plain decimals (no exponent) also equality at 6 decimal places, math-verify's
``float_rounding`` (so ``1234567.5`` is not ``1234567``; ``0.3333333`` is ``1/3``). A
percentage also matches its value divided by 100 (``25%`` = ``25`` = ``0.25``).

Safety: every pattern here is linear (no nested unbounded quantifiers), inputs longer than
200 characters are not parsed, numbers have at most 60 digits and exponents at most 100 in
absolute value, so no input can make this path slow. Anything that is not plainly a number
(``^``, ``\\sqrt``, ``\\pi``, tuples, intervals ...) returns None and goes to math-verify.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

_MAX_CHARS = 200
_MAX_EXP = 100
_ROUND = 10**6  # 6 decimal places, math-verify's float_rounding default
_RTOL = Fraction(1, 10**6)  # relative tolerance for numbers written as decimals

_WRAP_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mbox|operatorname|underline|boldsymbol|bm)"
    r"\s*\{([^{}]*)\}"
)
# `12th`, `1^{st}`, `22^\text{nd}` (after `_WRAP_RE`: `22^ nd `): the suffix after a digit.
_ORDINAL_RE = re.compile(r"(?<=\d)\s*(?:\^\s*\{\s*(?:st|nd|rd|th)\s*\}|\^\s*(?:st|nd|rd|th)|(?:st|nd|rd|th))(?![A-Za-z])")
# Left side of an assignment `x = 5`: one letter (with a subscript), a Greek letter, or a word.
_ASSIGNEE_RE = re.compile(r"[A-Za-z](?:_\{?\w+\}?)?|\\[A-Za-z]+|[A-Za-z]{3,}(?: [A-Za-z]+)*")
_SPACE_RE = re.compile(r"\\[;: ]|\\q?quad(?![A-Za-z])|~|\\(?:left|right)(?![A-Za-z])|\\displaystyle")
_DEGREE_RE = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree|°")
_WS_RE = re.compile(r"\s+")
_RELATION_RE = re.compile(r"\\(?:le|ge|ne|leq|geq|neq|lt|gt|approx|sim)(?![A-Za-z])|[<>≤≥≠≈]")
_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+"
_FULL_RE = re.compile(
    rf"""
    (?P<s1>[+-]?)\s*(?P<cur>\$|€|£|¥|USD(?![A-Za-z]))?\s*(?P<s2>[+-]?)\s*
    (?:
        (?P<mw>\d+)\s*(?:\\frac\s*\{{\s*(?P<mn>\d+)\s*\}}\s*\{{\s*(?P<md>\d+)\s*\}}|\\frac\s*(?P<mn1>\d)(?P<md1>\d)
                          |\s(?P<mn2>\d+)\s*/\s*(?P<md2>\d+))
      | \\frac\s*\{{\s*(?P<fn>[+-]?(?:{_NUM}))\s*\}}\s*\{{\s*(?P<fd>[+-]?(?:{_NUM}))\s*\}}
      | \\frac\s*(?P<fn1>\d)\s*(?P<fd1>\d)
      | (?P<n>{_NUM})
        (?:\s*/\s*(?P<d>{_NUM}))?
        (?:\s*[eE](?P<e>[+-]?\d{{1,3}})
          |\s*(?:\\times|\\cdot|×|\*)\s*10\s*\^\s*(?:\{{\s*(?P<e2>[+-]?\d{{1,3}})\s*\}}|(?P<e3>\d)))?
    )
    \s*(?P<pct>%)?
    \s*(?P<unit>[A-Za-z][A-Za-z²³/.\s-]*(?:\^\s*\{{?\s*\d\s*\}}?)?)?
    """,
    re.X,
)
_UNIT_SINGLE = frozenset("mgsLhKAVWJNl")  # one-letter units; other letters are variables
_MULTIPLIER = {"hundred": 100, "thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}


@dataclass(frozen=True)
class Number:
    """A parsed plain number.

    Attributes:
        value: exact value (percent sign not applied).
        decimal: written with a decimal point or exponent (compared with a tolerance).
        percent: written with ``%``.
        scientific: written with an exponent (``2e-7``, ``2 \\times 10^{-7}``): compared with
            the relative tolerance only, never at 6 decimal places.
    """

    value: Fraction
    decimal: bool
    percent: bool
    scientific: bool = False


def _clean(s: str) -> str:
    """Remove LaTeX spacing, wrappers, degree marks and escaped ``$``/``%`` signs."""
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("{,}", ",").replace("\\%", "%").replace("\\$", "$").replace("−", "-")
    s = s.replace("\\!", "").replace("\\,", "")  # thin spaces: `10,\!080`, `1\,000`
    s = _SPACE_RE.sub(" ", s)
    for _ in range(3):
        s2 = _WRAP_RE.sub(lambda m: " " + m.group(1) + " ", s)
        if s2 == s:
            break
        s = s2
    s = _DEGREE_RE.sub("", s)
    s = _ORDINAL_RE.sub("", s)
    s = _WS_RE.sub(" ", s).strip()  # single spaces keep `_FULL_RE` free of backtracking
    while s.startswith("{") and s.endswith("}") and s.count("{") == 1:
        s = s[1:-1].strip()
    return s.rstrip(".,;:!").strip()


def _frac(s: str) -> Fraction:
    return Fraction(s.replace(",", ""))


def _parts(g: dict) -> tuple[Fraction, Fraction, bool, bool] | None:
    """(numerator, denominator, written with a decimal point, scientific) of a `_FULL_RE` match's
    groups: a mixed number, a fraction (``a/b`` or ``\\frac``), or a decimal with an optional
    exponent; None for a malformed one (an improper mixed number, too many digits, a zero
    denominator, an exponent beyond `_MAX_EXP`)."""
    decimal = scientific = False
    try:
        if g["mw"] is not None:  # mixed number: whole + proper fraction
            mn, md = next((g[a], g[b]) for a, b in (("mn", "md"), ("mn1", "md1"), ("mn2", "md2")) if g[a] is not None)
            if len(g["mw"] + mn + md) > 60 or not 0 < int(mn) < int(md):
                return None  # `3 5/4` is not a mixed number
            num, den = int(g["mw"]) * Fraction(int(md)) + int(mn), Fraction(int(md))
        elif g["fn"] is not None:
            num, den = _frac(g["fn"]), _frac(g["fd"])
            decimal = "." in g["fn"] + g["fd"]
        elif g["fn1"] is not None:
            num, den = Fraction(int(g["fn1"])), Fraction(int(g["fd1"]))
        else:
            if len(g["n"]) > 60 or (g["d"] and len(g["d"]) > 60):
                return None
            num = _frac(g["n"])
            den = _frac(g["d"]) if g["d"] else Fraction(1)
            decimal = "." in g["n"] or "." in (g["d"] or "")
            exp = g["e"] or g["e2"] or g["e3"]
            if exp is not None:
                if abs(int(exp)) > _MAX_EXP:
                    return None
                num *= Fraction(10) ** int(exp)
                decimal = scientific = True
    except (ValueError, ZeroDivisionError):
        return None
    return None if den == 0 else (num, den, decimal, scientific)


@lru_cache(maxsize=1 << 16)
def parse_number(s: str) -> Number | None:
    """Parse `s` as one plain number, or return None.

    Args:
        s: an extracted answer or a reference, e.g. ``"$1,000.00"``, ``"x = \\dfrac{1}{2}"``,
            ``"25\\%"``, ``"30^\\circ"``, ``"5 \\text{ cm}"``, ``"12^{\\text{th}}"``, ``"1 1/4"``.

    Returns:
        A `Number`, or None when `s` is anything else (expressions, tuples, relations,
        equations other than ``variable = number``, variables, text, an improper fraction
        after a whole number, over 200 characters). Never raises.
    """
    if len(s) > _MAX_CHARS:
        return None
    s = _clean(s)
    if _RELATION_RE.search(s):
        return None
    if "=" in s:
        lhs, _, s = s.partition("=")
        if "=" in s or _ASSIGNEE_RE.fullmatch(lhs.strip()) is None:
            return None  # `3x + 4y = 7` is an equation, not the number 7: math-verify compares it
        s = s.strip()
    m = _FULL_RE.fullmatch(s)
    if m is None:
        return None
    g = m.groupdict()
    if g["s1"] and g["s2"]:
        return None
    negative = "-" in (g["s1"] + g["s2"])
    parts = _parts(g)
    if parts is None:
        return None
    num, den, decimal, scientific = parts
    value = num / den
    unit = (g["unit"] or "").strip()
    if unit:
        first = re.match(r"[A-Za-z]+", unit).group()  # type: ignore[union-attr]
        if len(first) == 1 and first not in _UNIT_SINGLE:
            return None  # `5 x` is an expression in x, not 5 of a unit
        if first.lower() in ("or", "and", "to", "plus", "minus", "times", "over", "e", "i"):
            return None
        value *= _MULTIPLIER.get(first.lower(), 1)
    return Number(-value if negative else value, decimal, g["pct"] is not None, scientific)


def _round6(x: Fraction) -> Fraction:
    return Fraction(round(x * _ROUND), _ROUND)


def close(a: Fraction, b: Fraction, places: bool = True) -> bool:
    """Decimal equality: ``|a - b| <= 1e-6 * max(|a|, |b|)`` and, when `places`, equal at 6
    decimal places (math-verify's ``float_rounding``). Exact arithmetic on fractions."""
    if abs(a - b) > _RTOL * max(abs(a), abs(b)):
        return False
    return not places or _round6(a) == _round6(b)


def numbers_equal(ref: Number, pred: Number) -> bool:
    """Numeric equality of two parsed numbers (rule in the module docstring).

    Exact for integers and fractions; with a decimal side, `close` (relative tolerance 1e-6,
    plus 6 decimal places unless a side is written with an exponent). A percentage also
    matches its value / 100.
    """
    refs = [ref.value] + ([ref.value / 100] if ref.percent else [])
    preds = [pred.value] + ([pred.value / 100] if pred.percent else [])
    rounded = ref.decimal or pred.decimal
    places = not (ref.scientific or pred.scientific)
    for a in refs:
        for b in preds:
            if a == b or (rounded and close(a, b, places)):
                return True
    return False


_TEXT_REF_RE = re.compile(
    r"\s*\\text(?:bf|rm|normal)?\s*\{[^{}\\\d]*[A-Za-z][^{}\\\d]*\}\s*|[A-Za-z][A-Za-z ,'\-]*[A-Za-z]"
)  # `\text{...}` with a letter and no digit, or plain words
_TEXT_KEY_DROP_RE = re.compile(r"[\s()\[\].,;:!'\"*\-]")


def text_reference(ref: str) -> str | None:
    """The comparison key of a text reference (``\\text{Monday}``, ``Monday``, ``\\text{(C)}``).

    Returns None when `ref` is not a text answer. Text answers are compared by key
    (lower case, spaces and punctuation removed) and never by sympy, which reads ``Monday``
    as the product of six symbols and so would accept any permutation of its letters.
    """
    if len(ref) > _MAX_CHARS or _TEXT_REF_RE.fullmatch(ref) is None:
        return None
    return text_key(ref)


def text_key(s: str) -> str:
    """Lower-case `s` with ``\\text{}`` wrappers, spaces and punctuation removed."""
    s = _WRAP_RE.sub(lambda m: m.group(1), s[: 4 * _MAX_CHARS])
    return _TEXT_KEY_DROP_RE.sub("", s).lower()
