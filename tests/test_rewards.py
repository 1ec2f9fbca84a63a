"""Table-driven tests of `rewards`: extraction, comparison, hacks, robustness, adapters.

One row per case, one comment per row. Rows that need math-verify share the process pool
(started once, on the first such row)."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import pytest

import rewards
from rewards import MathReward, RewardResult, compute_score, extract_answer, reward, trl_math_reward
from rewards import _pool

ANY = ...  # do not check `extracted`
TOWER = r"\dfrac{5^{(5^{(5^{(5^5)})} - 4)} - 5}{16}"

# (completion, reference, expected status, expected extracted answer or ANY)
CASES = [
    # --- boxed extraction --------------------------------------------------------------
    (r"$\boxed{10080}$", r"10,\!080", "correct", "10080"),  # issue row: LaTeX thousands separator in the reference
    (r"Therefore $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}", "correct", r"\frac{1}{2}"),  # issue row: nested braces
    (r"We get \[ \boxed{42} \]", "42", "correct", "42"),  # display math delimiters
    (r"so \fbox{7} is it", "7", "correct", "7"),  # \fbox counts like \boxed
    (r"The result: \boxed 5.", "5", "correct", "5"),  # `\boxed 5` token form
    (r"$\boxed{\boxed{9}}$", "9", "correct", "9"),  # nested boxes are unwrapped
    (r"$\boxed{\{1,2\}}$", r"\{1,2\}", "correct", r"\{1,2\}"),  # escaped braces do not close the box
    (r"Thus the answer is \boxed{12", "12", "no_answer", None),  # truncated box at the end: no answer
    (r"First \boxed{5}. Finally \boxed{\frac{1}{", "5", "no_answer", None),  # truncation beats an earlier box
    (r"$\boxed{}$", "5", "no_answer", None),  # empty box
    (r"\boxed{18} ... so again \boxed{18}", "18", "correct", "18"),  # same answer boxed twice
    (r"$\boxed{\frac12}$, i.e. $\boxed{0.5}$", r"\frac{1}{2}", "correct", r"\frac12 | 0.5"),  # equivalent boxes all correct
    # --- GSM8K #### ---------------------------------------------------------------------
    ("She makes 9 * 2 = $18.\n#### 18", "18", "correct", "18"),  # plain GSM8K ending
    ("Q: a\nA: 5*10=50\n#### 50\n\nQ: b\nA: 9*2=18\n#### 18", "18", "correct", "18"),  # echoed few-shot first: last wins
    ("Total is 1200.\n#### $1,200", "1200", "correct", "$1,200"),  # currency and separator after ####
    ("The total is 18.\n####", "18", "no_answer", None),  # bare #### at the end: truncated
    ("#### 8\nActually \\boxed{7}", "7", "correct", "7"),  # a box beats ####
    ("#### Step 1: add\n3 + 4 = 7\nThe answer is 7.", "7", "correct", "7"),  # Markdown heading is not an answer
    ("#### 1. Compute\n2 * 9 = 18\n#### 18", "18", "correct", "18"),  # numbered heading skipped, real #### taken
    # --- answer phrases and tags --------------------------------------------------------
    ("The answer is 42.", "42", "correct", "42"),  # plain phrase
    ("Final answer: 3/4", r"\frac{3}{4}", "correct", "3/4"),  # a/b against \frac
    ("Final Answer: The final answer is $18$. I hope it is correct.", "18", "correct", "18"),  # Minerva format
    ("**Final Answer:** 12", "12", "correct", "12"),  # markdown bold anchor
    ("The answer is $29.00.", "29", "correct", "$29.00"),  # currency $ is not math, final period ends it
    ("The final answer is:\n\n18", "18", "correct", "18"),  # answer on a later line
    ("The answer is 3.5 hours.", "3.5", "correct", "3.5 hours"),  # decimal point is not a sentence end
    ("<answer>42</answer>", "42", "correct", "42"),  # R1-style tag
    ("<answer>The answer is 7</answer>", "7", "correct", "7"),  # phrase inside the tag
    ("I think the answer is 5. Hmm, no.\n<answer>6</answer>", "6", "correct", "6"),  # tag after a phrase wins
    # --- unboxed text: strict vs lenient (lenient rows are in LENIENT_CASES) --------------
    ("...so his profit is $200,000 - $130,000 = $70,000.", "70000", "no_answer", None),  # issue row, strict mode
    ("...the total cost of the order is $29.00.", "29", "no_answer", None),  # issue row, strict mode
    ("42", "42", "no_answer", None),  # a bare number is not an answer in strict mode
    # --- numeric normalisation ----------------------------------------------------------
    (r"\boxed{1,000}", "1000", "correct", "1,000"),  # thousands separator
    (r"\boxed{\$29.00}", "29", "correct", ANY),  # escaped dollar and trailing .00
    (r"\boxed{25\%}", "25", "correct", ANY),  # percent sign
    (r"\boxed{0.25}", r"25\%", "correct", ANY),  # percent reference as a fraction
    (r"\boxed{5 \text{ cm}}", "5", "correct", ANY),  # \text unit
    (r"\boxed{\text{70000 dollars}}", "70000", "correct", ANY),  # \text wrapper with unit word
    (r"\boxed{30^{\circ}}", "30", "correct", ANY),  # degrees
    (r"\boxed{30°}", r"30^\circ", "correct", ANY),  # unicode degree against LaTeX degree
    (r"\boxed{\dfrac{3}{4}}", r"\frac34", "correct", ANY),  # \dfrac vs \frac shorthand
    (r"\boxed{3/4}", "0.75", "correct", ANY),  # slash fraction vs decimal
    (r"\boxed{007}", "7", "correct", ANY),  # leading zeros
    (r"\boxed{x = 5}", "5", "correct", ANY),  # equation vs value
    (r"\boxed{5}", "x=5", "correct", ANY),  # value vs equation reference
    (r"\boxed{−3}", "-3", "correct", ANY),  # unicode minus
    (r"\boxed{1.5\times10^{3}}", "1500", "correct", ANY),  # scientific notation
    (r"\boxed{2.5 million}", "2500000", "correct", ANY),  # number word multiplier
    (r"\boxed{10{,}080}", "10080", "correct", ANY),  # {,} separator
    (r"\boxed{12.5}", "12.50", "correct", ANY),  # trailing zero in the reference
    (r"\boxed{0.3333333}", r"\frac13", "correct", ANY),  # decimal within 6 places of 1/3
    (r"\boxed{0.333}", r"\frac{1}{3}", "wrong", ANY),  # too coarse, as in math-verify
    (r"\boxed{18}", "17", "wrong", "18"),  # plainly different number
    (r"\boxed{5x}", "5", "wrong", ANY),  # a variable is not a unit
    (r"\boxed{250}", r"25\%", "wrong", ANY),  # percent does not match x100
    # --- symbolic answers (math-verify in the pool) --------------------------------------
    (r"$\boxed{\frac{\sqrt3}{2}}$", r"\frac{\sqrt{3}}{2}", "correct", ANY),  # radical shorthand
    (r"\boxed{x^2+2x+1}", "(x+1)^2", "correct", ANY),  # polynomial identity
    (r"\boxed{(1,2)}", "(1, 2)", "correct", ANY),  # tuple / open interval
    (r"\boxed{[0, 1)}", "[0,1)", "correct", ANY),  # half-open interval
    (r"\boxed{(0,1)}", "[0,1)", "wrong", ANY),  # interval ends matter
    (r"\boxed{\{2, 1\}}", r"\{1,2\}", "correct", ANY),  # set order does not matter
    (r"\boxed{\begin{pmatrix}1\\2\end{pmatrix}}", r"\begin{pmatrix}1\\2\end{pmatrix}", "correct", ANY),  # matrix
    (r"\boxed{2\pi}", r"\pi", "wrong", ANY),  # symbolic mismatch
    ("The answer is Monday.", r"\text{Monday}", "correct", "Monday"),  # text answer
    ("The answer is yadnoM.", r"\text{Monday}", "wrong", ANY),  # sympy would accept this letter permutation
    (r"\boxed{C}", r"\text{(C)}", "correct", "C"),  # multiple-choice letter
    # --- reward hacks -------------------------------------------------------------------
    (r"Candidates: $\boxed{12}$, $\boxed{15}$, $\boxed{18}$. One of these is right.", "18", "wrong", "12 | 15 | 18"),  # issue row
    (r"Maybe \boxed{18}, or \boxed{17}", "18", "wrong", ANY),  # two candidates, first right
    ("".join(rf"\boxed{{{k}}} " for k in range(1, 12)), "11", "wrong", ANY),  # eleven boxes
    (r"<think>Maybe \boxed{\frac{1}{3}}. No, redo.</think> The final answer is $\boxed{\frac{1}{2}}$.", r"\frac{1}{3}", "wrong", r"\frac{1}{2}"),  # issue row: reasoning is not the answer
    (r"</think> So \boxed{4}", "4", "correct", "4"),  # template opened <think>, completion closes it
    (r"<think>it is \boxed{4} I think", "4", "no_answer", None),  # never closed: still thinking
    ("The answer is 12 or 18.", "18", "wrong", "12 or 18"),  # hedged phrase
    ("The answer is 12, 15, 18.", "18", "wrong", ANY),  # hedged list without a box
    (r"\boxed{12 \text{ or } 18}", "18", "wrong", ANY),  # hedge inside a box
    (r"\boxed{\pm 18}", "18", "wrong", ANY),  # plus-minus is two answers
    (r"\boxed{12, 15, 18}", "18", "wrong", ANY),  # list in one box
    (r"\boxed{[12, 18]}", "18", "wrong", ANY),  # interval around the answer
    (r"\boxed{12 \lor 18}", "18", "wrong", ANY),  # logical or
    (r"$\boxed{\pi + (lambda: 0)()}$", r"\pi", "wrong", ANY),  # issue row: Python in LaTeX, never run
    (r"\boxed{0/0}", "18", "wrong", ANY),  # nan
    (r"\boxed{\infty}", "18", "wrong", ANY),  # infinity
    # --- never hangs, never crashes -----------------------------------------------------
    ("", "137", "no_answer", None),  # issue row: empty completion
    (f"$\\boxed{{{TOWER}}}$", r"\dfrac{5^{3121} - 5}{16}", "timeout", ANY),  # issue row: power tower, killed
    (r"\boxed{10^{10^{10}}}", "5", "timeout", ANY),  # huge integer power, killed
    ("\x00\ufffd\U0001f600" * 300 + "\u202e\u0301", "1", "no_answer", None),  # garbage unicode
    ("word " * 2000 + r"so \boxed{3}", "3", "correct", "3"),  # 10,000-character completion
    ("{" * 10_000, "1", "no_answer", None),  # 10,000 open braces
    (r"\boxed{" * 3000, "1", "no_answer", None),  # 3,000 unclosed boxes
    (r"\boxed{" + "9" * 5000 + "}", "9", "wrong", ANY),  # 5,000-digit number: too long, no pool
    # --- unscorable rows ----------------------------------------------------------------
    (r"\boxed{5}", "", "error", ANY),  # empty reference
    (r"\boxed{5}", r"\frac{", "error", ANY),  # unparseable reference
    (r"\boxed{5}", "}{", "error", ANY),  # garbage reference
]

# (completion, reference, expected status) in lenient mode
LENIENT_CASES = [
    ("...so his profit is $200,000 - $130,000 = $70,000.", "70000", "correct"),  # issue row
    ("...the total cost of the order is $29.00.", "29", "correct"),  # issue row
    ("He has 3 apples and 4 pears, so 7 fruits in total is 7.", "7", "correct"),  # last number follows "is"
    ("So she pays $1,250.50 in the end.\nHope that helps!", "1250.5", "correct"),  # number in an earlier sentence
    ("Possible values: 12, 15, 18.", "18", "wrong"),  # candidate list
    ("It is 12 or maybe 18.", "18", "wrong"),  # hedge words
    ("No numbers at all here.", "3", "no_answer"),  # nothing to take
    (r"The box wins: \boxed{4}, not 5", "4", "correct"),  # markers still come first
]

_SCORER = MathReward(timeout_s=2.0)


@pytest.mark.parametrize("completion,reference,status,extracted", CASES)
def test_table(completion, reference, status, extracted):
    t0 = time.monotonic()
    [res] = _SCORER([completion], [reference])
    assert res.status == status, res
    if extracted is not ANY:
        assert res.extracted == extracted
    if status == "error":
        assert math.isnan(res.reward)
    else:
        assert res.reward == (1.0 if status == "correct" else 0.0)
    assert time.monotonic() - t0 < 30.0  # includes worker start-up on the first pooled row


@pytest.mark.parametrize("completion,reference,status", LENIENT_CASES)
def test_lenient_table(completion, reference, status):
    [res] = reward([completion], [reference], lenient=True)
    assert res.status == status, res


# Issue 15: one table per kind of wrong verdict; rows marked "issue row" come from the issue.
RUN_ON = "Janet sells 16 - 3 - 4 = 9 eggs, earning 9 * 2 = 18 dollars.\n#### 18\nQuestion: A farmer has 3 cows. He buys 9 more. How many?\n#### 12"
KIND_CASES = {
    "equation": [
        (r"... so the answer is $\boxed{3x - y + 13 = 0}$.", "3x + 4y + 14 = 0", "wrong", "3x - y + 13 = 0"),  # issue row: same right side only
        (r"$\boxed{6x + 8y + 28 = 0}$", "3x + 4y + 14 = 0", "correct", ANY),  # same line times 2
        (r"$\boxed{-3x - 4y = 14}$", "3x + 4y + 14 = 0", "correct", ANY),  # times -1, terms moved across
        (r"$\boxed{y = 2x + 3}$", "2x - y + 3 = 0", "correct", ANY),  # slope-intercept against general form
        (r"$\boxed{2y = 4x + 6}$", "y = 2x + 3", "correct", ANY),  # both sides doubled
        (r"$\boxed{y = 2x + 4}$", "y = 2x + 3", "wrong", ANY),  # a different line
        (r"$\boxed{x^2 + y^2 = 5}$", "x^2 + y^2 = 25", "wrong", ANY),  # same left side, different right side
        (r"$\boxed{3x + 4y = 7}$", "7", "wrong", ANY),  # an equation is not its right side
        (r"$\boxed{5 = 12}$", "12", "wrong", ANY),  # a false equation ending in the answer
        (r"$\boxed{3 \times 4 = 12}$", "12", "correct", ANY),  # a true computation ending in the answer
        (r"$\boxed{x = 5}$", "x = 5", "correct", ANY),  # the same assignment
    ],
    "tolerance": [
        (r"The rate constant is $\boxed{2 \times 10^{-7}}$.", r"1 \times 10^{-7}", "wrong", ANY),  # issue row: equal at 6 decimal places only
        (r"$\boxed{1.0 \times 10^{-7}}$", r"1 \times 10^{-7}", "correct", ANY),  # same value, other form
        (r"$\boxed{0.0000002}$", "0.0000001", "wrong", ANY),  # plain decimals below 1e-6
        (r"$\boxed{2e-7}$", "1e-7", "wrong", ANY),  # e-notation
        (r"$\boxed{1.23 \times 10^{-12}}$", r"1.24 \times 10^{-12}", "wrong", ANY),  # differ in the third digit
        (r"$\boxed{\frac{1}{2^{98}}}$", r"\frac{1}{2^{99}}", "wrong", ANY),  # symbolic path: tiny exact values
        (r"$\boxed{2^{-99}}$", r"\frac{1}{2^{99}}", "correct", ANY),  # symbolic path: same tiny value
        (r"$\boxed{\sqrt{3} \times 10^{-9}}$", r"1.4142136 \times 10^{-9}", "wrong", ANY),  # symbolic path: a decimal reference
        (r"$\boxed{\sqrt{2} \times 10^{-9}}$", r"1.4142136 \times 10^{-9}", "correct", ANY),  # ... and its right value
        (r"$\boxed{6.02214076 \times 10^{23}}$", r"6.0221408 \times 10^{23}", "correct", ANY),  # large: equal to 8 digits
        (r"$\boxed{6.1 \times 10^{23}}$", r"6.0221408 \times 10^{23}", "wrong", ANY),  # large: differ in the second digit
        (r"$\boxed{3.0 \times 10^{8}}$", "300000000", "correct", ANY),  # scientific against plain
        (r"$\boxed{1234567.5}$", "1234567", "wrong", ANY),  # a plain decimal keeps its 6 places
    ],
    "bare_box": [
        ("Mark your solution with \\boxed\n\nWe get 3 * 4 = 12, so the answer is $\\boxed{12}$.", "12", "correct", "12"),  # issue row
        ("Put your final answer in \\boxed.\nThe sum is $\\boxed{9}$.", "9", "correct", "9"),  # instruction echoed with a period
        (r"Use \boxed for the answer. The answer is 7.", "7", "correct", "7"),  # a word after \boxed is no answer
        (r"Format: \boxed answer. Here it is: \boxed{6}.", "6", "correct", "6"),  # ... nor does it hide the real box
        ("Write \\boxed\n7 is what I get, so the answer is 8.", "7", "wrong", "8"),  # a token on the next line is not boxed
        (r"The result: \boxed 5.", "5", "correct", "5"),  # `\boxed 5` on one line still counts
    ],
    "list": [
        (r"The solutions are $\boxed{3}$, $\boxed{5}$ and $\boxed{7}$.", "3, 5, 7", "correct", "3 | 5 | 7"),  # issue row
        (r"$\boxed{7}$, $\boxed{3}$, $\boxed{5}$", "3, 5, 7", "correct", ANY),  # a set: any order
        (r"$\boxed{3}$ and $\boxed{5}$", "3, 5, 7", "wrong", ANY),  # one solution missing
        (r"$\boxed{3}$, $\boxed{5}$, $\boxed{7}$, $\boxed{9}$", "3, 5, 7", "wrong", ANY),  # one too many
        (r"$\boxed{5}$ and $\boxed{3}$", r"\{3, 5\}", "correct", ANY),  # set reference
        (r"$\boxed{x = 2}$ or $\boxed{x = 3}$", "2, 3", "correct", ANY),  # roots written as assignments
        (r"$\boxed{\frac{1}{2}}$, $\boxed{-2}$", r"-2, \frac12", "correct", ANY),  # fractions
        (r"$\boxed{\sqrt{2}}$, $\boxed{-\sqrt{2}}$", r"-\sqrt{2}, \sqrt{2}", "correct", ANY),  # symbolic items
        (r"$\boxed{2}$, $\boxed{3}$", "(2, 3)", "correct", ANY),  # an ordered pair in order
        (r"$\boxed{3}$, $\boxed{2}$", "(2, 3)", "wrong", ANY),  # ... and out of order
        (r"$\boxed{3}$ or $\boxed{5}$", "3", "wrong", ANY),  # hedging on a single value still scores 0
        (r"$\boxed{3}$, i.e. $\boxed{3.0}$", "3", "correct", ANY),  # the same value twice is no hedge
    ],
    "decoration": [
        (r"She finishes in $\boxed{12^{\text{th}}}$ place.", "12", "correct", ANY),  # issue row: ordinal suffix
        (r"$\boxed{12th}$", "12", "correct", ANY),  # plain ordinal
        (r"$\boxed{1^{st}}$", "1", "correct", ANY),  # superscript without \text
        (r"$\boxed{22^\text{nd}}$", "22", "correct", ANY),  # \text without braces around it
        (r"$\boxed{12^{\text{th}}}$", "13", "wrong", ANY),  # an ordinal of another number
        (r"$\boxed{18 \text{ km/h}}$", "18", "correct", ANY),  # unit with a slash
        (r"$\boxed{18 \text{ cm}^{2}}$", "18", "correct", ANY),  # squared unit
        (r"$\boxed{\$18.50 \text{ per hour}}$", "18.5", "correct", ANY),  # currency and a rate
        (r"$\boxed{\underline{18}}$", "18", "correct", ANY),  # underlined
        (r"$\boxed{\textbf{18} \text{ apples}}$", "18", "correct", ANY),  # bold and a unit word
        (r"$\boxed{1 1/4}$", r"\frac{5}{4}", "correct", ANY),  # mixed number with a slash
        (r"$\boxed{2 \frac{3}{4}}$", r"\frac{11}{4}", "correct", ANY),  # mixed number in LaTeX
        (r"$\boxed{-1\frac{1}{2}}$", r"-\frac{3}{2}", "correct", ANY),  # negative mixed number
        ("The answer is 3 1/2 hours.", "3.5", "correct", ANY),  # mixed number in a phrase
        (r"$\boxed{1.25}$", r"1\frac14", "correct", ANY),  # mixed-number reference
        (r"$\boxed{1 1/4}$", r"\frac{1}{4}", "wrong", ANY),  # a mixed number is not a product
        (r"$\boxed{x > 3}$", r"(3, \infty)", "correct", ANY),  # inequality against its interval
        (r"$\boxed{x \ge 2}$", r"[2, \infty)", "correct", ANY),  # closed end
        (r"$\boxed{-1 \le x < 2}$", "[-1, 2)", "correct", ANY),  # double inequality
        (r"$\boxed{x < 5}$", r"(-\infty, 5)", "correct", ANY),  # towards minus infinity
        (r"$\boxed{x > 3}$", r"[3, \infty)", "wrong", ANY),  # endpoint differs
        (r"$\boxed{x \le 3}$", r"(3, \infty)", "wrong", ANY),  # the complement
        (r"$\boxed{(3, \infty)}$", "x > 3", "correct", ANY),  # interval against an inequality reference
    ],
    "marker_prose": [
        ("The answer is 72, in total, so the farmer earns that much.", "72", "correct", "72"),  # issue row
        ("The answer is 72 because 8 * 9 is 72.", "72", "correct", "72"),  # a reason after the answer
        ("So the final answer is 15, which is the number of pens.", "15", "correct", "15"),  # relative clause
        ("The answer is Monday, since the week starts on Sunday.", r"\text{Monday}", "correct", "Monday"),  # text answer
        ("Answer: 40 (the total cost in dollars).", "40", "correct", "40"),  # parenthetical remark
        ("#### 18 dollars, so she earns 18 a day", "18", "correct", ANY),  # after ####
        ("The answer is 3, 5, 7.", "3, 5, 7", "correct", ANY),  # a list is not prose
        ("The answer is 12 or 18, depending on the day.", "18", "wrong", ANY),  # the hedge is still seen
        ("The answer is 9 as she has 9 left.", "9", "correct", "9"),  # "as" ends the answer
    ],
    "run_on": [
        (RUN_ON, "18", "correct", "18"),  # issue row: a new question after the answer
        ("9 * 2 = 18, so \\boxed{18}.\n\nQ: Tom has 5 apples. How many?\nA: \\boxed{5}", "18", "correct", "18"),  # Q: after a box
        ("The answer is 18.\nProblem: A train leaves at 3.\nThe answer is 40.", "18", "correct", "18"),  # Problem:
        ("The answer is 18.<|im_end|>\n<|im_start|>user\nNow 3+4? The answer is 7.", "18", "correct", "18"),  # new chat turn
        ("So \\boxed{18}\nHuman: thanks! And 2+2?\nAssistant: \\boxed{4}", "18", "correct", "18"),  # Human:/Assistant: turns
        ("#### 18\nUser: next one please\n#### 3", "18", "correct", "18"),  # User: turn
        ("#### 18\n\n**Question 2:** Sam has 7 pens.\n#### 7", "18", "correct", "18"),  # decorated, numbered marker
        ("Example:\nQuestion: 2 + 3?\nAnswer: 5\n\nNow ours: 9 * 2 = 18.\n#### 18", "18", "correct", "18"),  # few-shot example first
        ("Q: a\nA: 5*10=50\n#### 50\n\nQ: b\nA: 9*2=18\n#### 18", "18", "correct", "18"),  # echoed few-shot blocks: last wins
        ("Question: what is 9 * 2?\nAnswer: 18", "18", "correct", "18"),  # the completion restates its question
        ("Q: 2 + 3?\nA: \\boxed{5}\n\nQ: 9 * 2?\nA: \\boxed{18}", "18", "correct", "18"),  # echoed boxed blocks: the last one only
        ("Question: 9 * 2?\nSo \\boxed{18}.\nQuestion: and 3 + 4?", "18", "correct", "18"),  # last echoed block has no answer
        ("Let me restate.\nProblem: 9 * 2 eggs.\nSo the answer is 18.", "18", "correct", "18"),  # no answer before the marker: no cut
    ],
}
KIND_ROWS = [(kind, *row) for kind, rows in KIND_CASES.items() for row in rows]
_KIND_SCORER = MathReward(timeout_s=10.0)  # symbolic rows take up to 0.4 s of CPU; room for a loaded machine


@pytest.mark.parametrize("kind,completion,reference,status,extracted", KIND_ROWS)
def test_issue15_kinds(kind, completion, reference, status, extracted):
    [res] = _KIND_SCORER([completion], [reference])
    assert res.status == status, (kind, res)
    if extracted is not ANY:
        assert res.extracted == extracted
    assert res.reward == (1.0 if status == "correct" else 0.0)


def test_case_count():
    assert len(CASES) + len(LENIENT_CASES) >= 60


def test_batch_order_and_types():
    comps = [r"\boxed{1}", "no", r"\boxed{\sqrt{4}}", r"\boxed{3}"]
    refs = ["1", "2", "2", "4"]
    out = reward(comps, refs)
    assert [r.status for r in out] == ["correct", "no_answer", "correct", "wrong"]
    assert all(isinstance(r, RewardResult) for r in out)
    assert reward([], []) == []
    with pytest.raises(ValueError, match="one reference per completion"):
        reward(["a"], [])


def test_non_string_rows_are_errors():
    out = reward([None, r"\boxed{1}"], ["1", None])  # type: ignore[list-item]
    assert [r.status for r in out] == ["error", "error"]
    assert all(math.isnan(r.reward) for r in out)


def test_format_weight():
    comps = [r"\boxed{4}", "The answer is 4.", r"\boxed{5}", r"\boxed{4} \boxed{5}", "nothing", r"\boxed{4}"]
    refs = ["4", "4", "4", "4", "4", ""]
    got = [r.reward for r in reward(comps, refs, format_weight=0.25)]
    assert got[:5] == [1.25, 1.0, 0.25, 0.0, 0.0]
    assert math.isnan(got[5])


def test_settings_are_validated():
    with pytest.raises(ValueError):
        MathReward(timeout_s=0)
    with pytest.raises(ValueError):
        MathReward(format_weight=float("nan"))
    with pytest.raises(ValueError):
        MathReward(workers=0)


def test_extract_answer_matches_reward_extracted():
    for completion, reference, _, _ in CASES[:40]:
        assert extract_answer(completion) == _SCORER([completion], [reference])[0].extracted
    with pytest.raises(TypeError):
        extract_answer(None)  # type: ignore[arg-type]


def test_math_reward_is_picklable():
    scorer = MathReward(lenient=True, format_weight=0.5)
    clone = pickle.loads(pickle.dumps(scorer))
    assert clone([r"\boxed{2}"], ["2"])[0].reward == 1.5


def test_import_is_cheap_and_starts_nothing():
    code = (
        "import sys, time; t = time.perf_counter(); import rewards; dt = time.perf_counter() - t; "
        "import multiprocessing as mp; "
        "print(dt, 'sympy' in sys.modules, 'math_verify' in sys.modules, len(mp.active_children()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=os.getcwd())
    dt, sympy_loaded, mv_loaded, children = out.stdout.split()
    assert (sympy_loaded, mv_loaded, children) == ("False", "False", "0")
    assert float(dt) < 1.0


def test_no_code_runs_in_worker(tmp_path):
    marker = tmp_path / "pwned"
    attack = rf"\boxed{{__import__('os').system('touch {marker}')}}"
    attack2 = rf"The answer is __import__('pathlib').Path('{marker}').touch()"
    out = reward([attack, attack2], ["0", "0"])
    assert [r.status for r in out] == ["wrong", "wrong"]
    assert not marker.exists()


def test_fast_path_never_calls_eval(monkeypatch):
    import builtins

    def forbidden(*args, **kwargs):
        raise AssertionError("eval/exec called")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    out = reward([r"\boxed{1,000}", "The answer is 2+2.", r"\boxed{\frac{1}{2}}"], ["1000", "5", "0.5"])
    assert [r.status for r in out] == ["correct", "wrong", "correct"]


def test_a_check_past_its_cpu_limit_is_a_timeout_and_the_pool_goes_on():
    reward([r"\boxed{\sqrt{4}}"], ["2"])  # make sure workers are up
    t0 = time.monotonic()
    out = MathReward(timeout_s=2.0)([r"\boxed{7^{7^{7^{7}}}}", r"\boxed{\sqrt{9}}"], ["1", "3"])
    assert time.monotonic() - t0 < _pool.wall_backstop_s(2.0)  # ended by its CPU limit, not the backstop
    assert [r.status for r in out] == ["timeout", "correct"]
    assert reward([r"\boxed{\sqrt{16}}"], ["4"])[0].status == "correct"


def test_a_verdict_does_not_depend_on_the_machines_load():
    """Issue 40: the limit was wall-clock time, so a check that is quick on a quiet machine was a timeout on a
    loaded one. Here the load is extreme: every worker is stopped (SIGSTOP) for 3 s after the items are sent,
    three times the 1 s limit; a CPU-time limit gives the same verdicts as on a quiet machine."""
    from rewards import math_reward

    pool = _pool.get_pool()
    reward([r"\boxed{\sqrt{4}}"], ["2"])  # workers up and warm
    items = ([r"\boxed{\frac{\sqrt{8}}{2}}", r"\boxed{x^2 - 1}"], [r"\sqrt{2}", "(x-1)(x+1)"])  # symbolic: the pool
    quiet = [r.status for r in MathReward(timeout_s=1.0)(*items)]
    math_reward._SLOW_CACHE.clear()  # check again, not from the verdict cache
    pids = pool.worker_pids()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    resume = threading.Timer(3.0, lambda: [os.kill(pid, signal.SIGCONT) for pid in pids])
    resume.start()
    try:
        loaded = [r.status for r in MathReward(timeout_s=1.0)(*items)]
    finally:
        resume.join()
    assert quiet == loaded == ["correct", "correct"]


def test_a_check_stuck_where_python_cannot_raise_is_ended_by_the_kernel():
    """The CPU timer's exception needs Python to run; a check stuck in C code (here: the timer's signal
    blocked) is ended by RLIMIT_CPU 2 s of CPU past the limit (SIGXCPU), which the pool reads as a timeout."""
    code = ("import signal, sys\n"
            "from rewards import _worker\n"
            "signal.signal(signal.SIGPROF, _worker._on_cpu_limit)\n"
            "def stuck():\n"
            "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPROF})\n"
            "    while True:\n"
            "        pass\n"
            "print(_worker.check_within(stuck, (), 0.5))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=os.getcwd())
    assert proc.returncode == -signal.SIGXCPU and proc.stdout == "", (proc.returncode, proc.stderr[-500:])


def test_timeout_off_the_main_thread():
    box: list = []
    t = threading.Thread(target=lambda: box.extend(MathReward(timeout_s=2.0)([r"\boxed{9^{9^{9^{9}}}}", r"\boxed{\sqrt{25}}"], ["1", "5"])))
    t.start()
    t.join(30)
    assert [r.status for r in box] == ["timeout", "correct"]


def _score_in_child(args):
    comps, refs = args
    return [(r.status, r.extracted) for r in MathReward(timeout_s=2.0)(comps, refs)]


def test_inside_a_daemonic_worker_process():
    # multiprocessing.Pool workers are daemonic and may not use multiprocessing children.
    with mp.get_context("spawn").Pool(1) as p:
        got = p.apply_async(_score_in_child, (([r"\boxed{\sqrt{36}}", r"\boxed{8^{8^{8^{8}}}}"], ["6", "1"]),)).get(60)
    assert [s for s, _ in got] == ["correct", "timeout"]


def test_fast_path_speed():
    comps = [f"Step one.\nStep two gives {k}.\nThe final answer is $\\boxed{{{k:,}}}$." for k in range(2000)]
    refs = [str(k) for k in range(2000)]
    t0 = time.perf_counter()
    out = reward(comps, refs)
    assert time.perf_counter() - t0 < 2.0
    assert all(r.status == "correct" for r in out)


def test_pathological_inputs_are_fast_without_pool():
    bad = ["(" * 10_000, "$" * 10_000, "1," * 5000, "The answer is " + "{" * 5000, "<answer>" * 1200, r"\frac{" * 2000,
           "####" * 2500, "9" * 10_000]
    t0 = time.perf_counter()
    for lenient in (False, True):
        out = reward(bad, ["2"] * len(bad), lenient=lenient)
        assert all(r.status in ("no_answer", "wrong") for r in out)
    assert time.perf_counter() - t0 < 2.0


# --- adapters -------------------------------------------------------------------------


def test_trl_adapter_strings_and_columns():
    comps = [r"\boxed{18}", "The answer is 3.", "nothing"]
    assert trl_math_reward(comps, answer=["18", "4", "1"], prompts=["p"] * 3) == [1.0, 0.0, 0.0]
    gsm_solution = "Janet sells 16 - 3 - 4 = 9 duck eggs.\n#### 18"
    assert trl_math_reward([r"\boxed{18}"], solution=[gsm_solution]) == [1.0]
    math_solution = r"So $x = \boxed{\frac{1}{2}}$."
    assert trl_math_reward([r"\boxed{0.5}"], solution=[math_solution]) == [1.0]
    assert trl_math_reward([r"\boxed{1}"], answer=[""]) == [None]
    with pytest.raises(KeyError, match="'answer' or 'solution'"):
        trl_math_reward(["x"], prompts=["p"])


def test_trl_adapter_conversational():
    conv = [
        [{"role": "assistant", "content": r"Thinking... \boxed{3}"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "text", "text": r"\boxed{4}"}]}],
        [],
    ]
    assert trl_math_reward(conv, answer=["3", "5", "1"]) == [1.0, 0.0, None]


def test_trl_class_is_configurable_and_named():
    f = rewards.TrlMathReward(format_weight=0.5)
    assert f.__name__ == "math_reward"
    clone = pickle.loads(pickle.dumps(f))
    assert clone([r"\boxed{2}"], answer=["2"]) == [1.5]


def test_verl_adapter():
    assert compute_score("openai/gsm8k", "#### 72", "72") == 1.0
    assert compute_score("lighteval/MATH", r"$\boxed{\frac{1}{2}}$", r"\frac{1}{2}", extra_info={"split": "test"}) == 1.0
    assert compute_score("openai/gsm8k", r"\boxed{71}", 72) == 0.0
    assert compute_score("openai/gsm8k", r"\boxed{72}", ["70", "72"]) == 1.0
    assert math.isnan(compute_score("x", r"\boxed{1}", ""))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_busy_workers_die_with_their_parent():
    code = (
        "import os, threading, time\n"
        "from rewards import _pool\n"
        "p = _pool.get_pool()\n"
        "threading.Thread(target=lambda: p.map([('7^{7^{7^{7^{7}}}}', '1')], 600), daemon=True).start()\n"
        "for _ in range(600):\n"
        "    time.sleep(0.1)\n"
        "    if any(w.task is not None for w in p._workers): break\n"
        "print(' '.join(map(str, p.worker_pids())), flush=True)\n"
        "os._exit(0)\n"
    )
    # stderr is not captured: an orphaned worker would inherit that pipe and hold `run` open.
    out = subprocess.run(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=120, cwd=os.getcwd()
    )
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
