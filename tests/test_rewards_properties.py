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


# --- issue 15: the kinds of wrong verdicts, as properties ------------------------------

POOLED = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
nonzero = st.integers(-9, 9).filter(bool)


def _linear(a: int, b: int, c: int) -> str:
    """``a x + b y + c`` in LaTeX with its signs folded: ``3x - 4y + 14``."""
    out = f"{a}x"
    for coef, var in ((b, "y"), (c, "")):
        out += f" {'-' if coef < 0 else '+'} {abs(coef)}{var}"
    return out


@POOLED
@given(nonzero, nonzero, st.integers(-20, 20), st.integers(-4, 4).filter(bool), st.integers(1, 9))
def test_equation_matches_its_nonzero_multiples_only(a, b, c, k, d):
    ref = _linear(a, b, c) + " = 0"
    comps = [
        rf"$\boxed{{{_linear(k * a, k * b, k * c)} = 0}}$",  # both sides times k: the same line
        rf"$\boxed{{{_linear(a, b, c + d)} = 0}}$",  # another constant: a parallel line
        rf"$\boxed{{{_linear(a, b, 0)[:-4]} = {-c}}}$",  # the same line with c moved across ...
    ]
    refs = [ref, ref, str(-c)]  # ... is not its right side
    assert [r.status for r in reward(comps, refs)] == ["correct", "wrong", "wrong"]


SCIENTIFIC = [
    lambda m, e: rf"{m} \times 10^{{{e}}}",  # 123 \times 10^{-9}
    lambda m, e: f"{m}e{e}",  # 123e-9
    lambda m, e: rf"{_plain(Fraction(m, 10))} \cdot 10^{{{e + 1}}}",  # 12.3 \cdot 10^{-8}
    lambda m, e: _plain(Fraction(m) * Fraction(10) ** e),  # 0.000000123
]


@FAST
@given(st.integers(1, 999), st.integers(1, 999), st.integers(-40, 40), st.sampled_from(SCIENTIFIC), st.sampled_from(SCIENTIFIC))
def test_tiny_and_huge_numbers_compare_relatively(m1, m2, e, r_ref, r_pred):
    assume(m1 != m2)
    comps = [rf"$\boxed{{{r_pred(m1, e)}}}$", rf"$\boxed{{{r_pred(m2, e)}}}$"]
    assert [r.status for r in reward(comps, [r_ref(m1, e)] * 2)] == ["correct", "wrong"]


@POOLED
@given(st.integers(20, 300))
def test_tiny_powers_of_two_differ(k):
    comps = [rf"$\boxed{{\frac{{1}}{{2^{{{k + 1}}}}}}}$", rf"$\boxed{{2^{{-{k}}}}}$"]
    assert [r.status for r in reward(comps, [rf"\frac{{1}}{{2^{{{k}}}}}"] * 2)] == ["wrong", "correct"]


PLAIN_TEXT = st.text(alphabet="abcdefghij ,.:;!?", max_size=80)


@FAST
@given(PLAIN_TEXT, st.sampled_from(["", ".", ":", "\n", "\n\n", " for the answer", " answer"]), st.integers(0, 10**6))
def test_bare_box_is_no_answer_and_hides_nothing(text, after, n):
    completion = f"Mark your solution with \\boxed{after}{text}\nWe get $\\boxed{{{n}}}$."
    assert extract_answer(completion) == str(n)


@FAST
@given(st.lists(st.integers(-50, 50), min_size=3, max_size=6, unique=True), st.randoms(use_true_random=False))
def test_boxed_items_against_a_list_reference(items, rnd):
    boxes = lambda vs: ", ".join(rf"$\boxed{{{v}}}$" for v in vs)  # noqa: E731
    shuffled = rnd.sample(items, len(items))
    comps = [boxes(shuffled), boxes(shuffled[:-1]), boxes(shuffled + [max(items) + 1]), boxes(items), boxes(items[::-1]),
             boxes(items[:2])]
    refs = [", ".join(map(str, items))] * 3 + [f"({items[0]}, {items[1]}, {items[2]})" if len(items) == 3 else str(items[0])] * 2
    refs += [str(items[0])]  # a single value: two different boxes are a hedge
    want = ["correct", "wrong", "wrong", "correct" if len(items) == 3 else "wrong", "wrong", "wrong"]
    assert [r.status for r in reward(comps, refs)] == want


ORDINALS = [lambda n: f"{n}th", lambda n: rf"{n}^{{\text{{th}}}}", lambda n: f"{n}^{{st}}", lambda n: rf"{n}^\text{{nd}}"]
UNITS = [r"\text{ km/h}", r"\text{ cm}^{2}", r"\ \text{apples}", r"\,\mathrm{m}", " dollars", r"\text{ per hour}"]


@FAST
@given(st.integers(1, 10**6), st.sampled_from(ORDINALS), st.sampled_from(UNITS))
def test_ordinals_and_units_decorate_a_number(n, ordinal, unit):
    comps = [rf"\boxed{{{ordinal(n)}}}", rf"\boxed{{{ordinal(n)}}}", rf"\boxed{{\underline{{{n}}}{unit}}}"]
    assert [r.status for r in reward(comps, [str(n), str(n + 1), str(n)])] == ["correct", "wrong", "correct"]


@FAST
@given(st.integers(1, 999), st.integers(2, 99), st.data())
def test_mixed_number_is_a_sum_not_a_product(w, q, data):
    p = data.draw(st.integers(1, q - 1))
    form = data.draw(st.sampled_from([f"{w} {p}/{q}", rf"{w}\frac{{{p}}}{{{q}}}", rf"{w} \frac{{{p}}}{{{q}}}"]))
    value, product = rf"\frac{{{w * q + p}}}{{{q}}}", rf"\frac{{{w * p}}}{{{q}}}"
    assert [r.status for r in reward([rf"\boxed{{{form}}}"] * 2, [value, product])] == ["correct", "wrong"]


@POOLED
@given(st.integers(-50, 50), st.sampled_from([(">", "({a}, \\infty)", "[{a}, \\infty)"), ("\\le", "(-\\infty, {a}]", "(-\\infty, {a})")]))
def test_inequality_is_its_interval(a, case):
    rel, same, other = case
    comp = rf"$\boxed{{x {rel} {a}}}$"
    assert [r.status for r in reward([comp, comp], [same.format(a=a), other.format(a=a)])] == ["correct", "wrong"]


PROSE = [", in total, so the farmer earns that much.", " because 8 * 9 is 72.", ", which is the number of pens.",
         " (the total cost in dollars).", " as she has that many left.", " since the rest is spent.", " \u2014 the total."]


@FAST
@given(st.integers(-(10**6), 10**6), st.sampled_from(PROSE), st.sampled_from(["The answer is ", "Final answer: ", "#### "]))
def test_answer_marker_then_prose_takes_the_answer(n, prose, marker):
    assert extract_answer(f"Some work.\n{marker}{n}{prose}") == str(n)


MARKERS = ["Question:", "Q:", "Problem:", "**Question 2:**", "Human:", "User:"]
FORMS = [lambda n: f"#### {n}", lambda n: f"The answer is {n}.", lambda n: rf"So $\boxed{{{n}}}$."]


@FAST
@given(st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from(MARKERS), st.sampled_from(FORMS))
def test_run_on_question_is_cut_and_few_shot_echo_kept(a, b, marker, form):
    assume(a != b)
    run_on = f"Some work.\n{form(a)}\n{marker} A new problem about {b} things.\n{form(b)}"
    few_shot = f"{marker} An example about {b}.\n{form(b)}\n\n{marker} Ours.\n{form(a)}"
    turn = f"Some work.\n{form(a)}<|im_end|>\n<|im_start|>user\n{form(b)}"
    assert [extract_answer(t) for t in (run_on, few_shot, turn)] == [str(a)] * 3
