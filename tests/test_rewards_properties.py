"""Property tests of `rewards` (hypothesis): a number equals itself however it is written,
a different number never does, and extraction/scoring never raise or stall.

Values have at most 4 decimal places, so two different values never meet under the
6-decimal rounding that decimals are compared with (see `rewards.numeric`)."""

from __future__ import annotations

import time
from fractions import Fraction

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rewards import extract_answer, reward
from rewards.extract import unwrap
from rewards.numeric import numbers_equal, parse_number

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def decimals(draw) -> Fraction:
    """A value n / 10**k with |n| < 10**10 and k <= 4."""
    n = draw(st.integers(-(10**10), 10**10))
    k = draw(st.integers(0, 4))
    return Fraction(n, 10**k)


def _plain(x: Fraction, places: int | None = None) -> str:
    """Exact decimal text of a terminating `x`; `places` pads with trailing zeros."""
    sign = "-" if x < 0 else ""
    x = abs(x)
    k = 0
    while (x * 10**k).denominator != 1:
        k += 1
    k = max(k, places or 0)
    digits = str(int(x * 10**k)).rjust(k + 1, "0")
    whole, frac = digits[: len(digits) - k] if k else digits, digits[len(digits) - k:] if k else ""
    return sign + whole + ("." + frac if frac else "")


def _grouped(s: str, sep: str) -> str:
    sign = "-" if s.startswith("-") else ""
    whole, _, frac = s.lstrip("-").partition(".")
    groups = []
    while len(whole) > 3:
        groups.insert(0, whole[-3:])
        whole = whole[:-3]
    groups.insert(0, whole)
    return sign + sep.join(groups) + ("." + frac if frac else "")


RENDERERS = [
    lambda x: _plain(x),  # 1234.5
    lambda x: _grouped(_plain(x), ","),  # 1,234.5
    lambda x: _grouped(_plain(x), r",\!"),  # 1,\!234.5
    lambda x: _grouped(_plain(x), "{,}"),  # 1{,}234.5
    lambda x: _plain(x, 4) + "00",  # trailing zeros
    lambda x: ("-" if x < 0 else "") + "$" + _grouped(_plain(abs(x), 2), ","),  # -$1,234.50
    lambda x: r"\$" + _plain(x),  # \$1234.5
    lambda x: r"\text{" + _plain(x) + "}",  # \text{1234.5}
    lambda x: _plain(x) + r" \text{ dollars}",  # unit in \text
    lambda x: _plain(x) + r"\,\mathrm{cm}",  # thin space and \mathrm unit
    lambda x: "x = " + _plain(x),  # equation
    lambda x: r"\boxed{" + _plain(x) + "}",  # nested box
    lambda x: ("-" if x < 0 else "") + "00" + _plain(abs(x)),  # leading zeros
]
render = st.sampled_from(RENDERERS)


@FAST
@given(decimals(), render, render)
def test_number_equals_itself_however_written(x, r_ref, r_pred):
    ref, pred = r_ref(x), r_pred(x)
    assert parse_number(unwrap(pred)) is not None and parse_number(unwrap(ref)) is not None  # decided in-process
    [res] = reward([f"So the total is this.\nThe final answer is $\\boxed{{{pred}}}$."], [ref])
    assert res.status == "correct", (pred, ref, res)


@FAST
@given(decimals(), decimals(), render, render)
def test_different_number_never_equal(x, y, r_ref, r_pred):
    assume(x != y)
    ref, pred = r_ref(x), r_pred(y)
    [res] = reward([f"The final answer is $\\boxed{{{pred}}}$."], [ref])
    assert res.status == "wrong", (pred, ref, res)


@FAST
@given(st.integers(-(10**6), 10**6), st.integers(1, 10**4))
def test_fraction_forms_agree(p, q):
    x = Fraction(p, q)
    forms = [rf"\frac{{{p}}}{{{q}}}", rf"\dfrac{{{p}}}{{{q}}}", f"{p}/{q}"]
    if (x * 10**4).denominator == 1:
        forms.append(_plain(x))
    parsed = [parse_number(f) for f in forms]
    assert all(n is not None and n.value == x for n in parsed)
    assert all(numbers_equal(parsed[0], n) for n in parsed)


@FAST
@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_percent_matches_value_and_fraction_only(n, m):
    pct = parse_number(f"{n}\\%")
    assert numbers_equal(parse_number(str(n)), pct)
    assert numbers_equal(parse_number(_plain(Fraction(n, 100))), pct)
    assume(m != n and Fraction(m) != Fraction(n, 100))
    assert not numbers_equal(parse_number(str(m)), pct)


SAFE_TEXT = st.text(alphabet=st.characters(blacklist_characters="\\{}$<>#*", blacklist_categories=("Cs",)), max_size=300)


@FAST
@given(SAFE_TEXT, st.integers(-(10**9), 10**9), SAFE_TEXT)
def test_last_box_is_the_answer(prefix, n, suffix):
    text = f"{prefix} so $\\boxed{{{n}}}$ {suffix}"
    assert extract_answer(text) == str(n)
    assert extract_answer(text, lenient=True) == str(n)


@FAST
@given(st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from(["", "$", "\\[ ", "Answer: "]))
def test_boxing_several_candidates_never_pays(a, b, wrap):
    assume(a != b)
    text = f"{wrap}\\boxed{{{a}}} ... {wrap}\\boxed{{{b}}}"
    assert [r.status for r in reward([text, text], [str(a), str(b)])] == ["wrong", "wrong"]


@FAST
@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_reasoning_inside_think_is_ignored(a, b):
    assume(a != b)
    text = f"<think>maybe \\boxed{{{a}}}</think>The final answer is \\boxed{{{b}}}."
    assert [r.status for r in reward([text, text], [str(b), str(a)])] == ["correct", "wrong"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=2000), st.booleans())
def test_arbitrary_text_never_raises_or_stalls(text, lenient):
    t0 = time.perf_counter()
    [res] = reward([text], ["42"], lenient=lenient, timeout_s=1.0)
    assert res.status in ("correct", "wrong", "no_answer", "timeout")
    assert isinstance(res.reward, float)
    assert time.perf_counter() - t0 < 10.0


@FAST
@given(st.lists(st.tuples(st.integers(0, 999), st.integers(0, 999), st.sampled_from(["box", "hash", "none"])), max_size=20))
def test_batch_equals_rows_in_order(rows):
    comps = [rf"\boxed{{{a}}}" if kind == "box" else f"#### {a}" if kind == "hash" else f"it is {a}" for a, _, kind in rows]
    refs = [str(b) for _, b, _ in rows]
    batch = reward(comps, refs)
    assert batch == [reward([c], [r])[0] for c, r in zip(comps, refs)]
