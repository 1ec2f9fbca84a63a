"""Final-answer extraction from a model completion.

Which span of a completion is "the final answer" decides what evolution strategies are
paid for, so extraction is strict by default and every rule below is deliberate.

First the completion is cut to the model's own reply (`cut_run_on`):

- at the first new chat turn (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``,
  ``<|eot_id|>``, ``<end_of_turn>``, ``[INST]``, ``</s>`` ...) after some text;
- at the first line that starts a new question or turn (``Question:``, ``Q:``,
  ``Problem:``, ``Human:``, ``User:``, ``Assistant:``, also ``**Question 2:**``) once an
  answer has been given before it: a base model that answers and then writes the next
  few-shot question (lm-evaluation-harness stops generation at ``Question:`` for the same
  reason). When the first such line comes before any answer, the completion is itself a
  sequence of echoed question/answer blocks (a few-shot example, then the real question):
  the last block that has an answer is kept, so the last answer wins.

Then (first rule that finds something wins):

1. Reasoning is not the answer. Text up to the last ``</think>`` is dropped (Qwen3 /
   DeepSeek-R1 style). A ``<think>`` that is never closed means the model was cut off while
   thinking: no answer.
2. ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces (escaped ``\\{`` ``\\}`` do not
   count), nested boxes unwrapped, inside ``$``, ``$$``, ``\\( \\)`` or ``\\[ \\]`` or bare.
   ``\\boxed 5`` (one number after a space on the same line) counts too; a ``\\boxed``
   followed by anything else (``Mark your answer with \\boxed.``) is not an answer and does
   not hide a real box after it.
   The math-competition convention (Hendrycks et al. 2021, MATH, arXiv 2103.03874;
   Lewkowycz et al. 2022, Minerva, arXiv 2206.14858). A ``\\boxed{`` that is never closed
   means the completion was truncated inside its answer: no answer, whatever came before.
   *Every* distinct box is returned (see ``Extraction.answers``): the scorer pays only when
   all of them are correct, because boxing every candidate is a known reward hack.
3. GSM8K's ``#### N`` (Cobbe et al. 2021, arXiv 2110.14168): the *last* one, so that a
   few-shot example echoed before the real solution does not count. A bare ``####`` at the
   end (truncated) is no answer; Markdown headings (``#### Step 1``) are not answers.
4. "The answer is X" / "Final answer: X" / "Answer: X" (Minerva's ``Final Answer: The final
   answer is X. I hope it is correct.`` included) and ``<answer>X</answer>`` (DeepSeek-R1's
   format, arXiv 2501.12948). The issue lists the tag after the phrases; we take whichever of
   the two *ends last* in the text, because a phrase inside the reasoning should not beat an
   explicit closing tag. X runs to the end of its sentence (a ``.`` ``!`` ``?`` followed by
   space, or a newline), ignoring periods inside ``$...$`` math and decimal points, and
   stops before prose that follows the answer (`cut_prose`: ``72, in total, so ...``,
   ``72 because ...``, ``40 (the total)``); a hedged sentence (``12 or 18, depending ...``)
   is kept whole so that the hedge is still seen. The same cut applies after ``####``.
5. Lenient mode only (``lenient=True``, off by default): the last number of the text. The
   issue's unboxed GSM8K examples (``... = $70,000.`` and ``... is $29.00.``) are correct in
   lenient mode and ``no_answer`` in strict mode. Lenient mode guards against hedging: the
   last number is taken only when its sentence has no hedge word ("or", "maybe", ...) and
   either holds one distinct number or the last number directly follows ``=`` or a verb
   such as "is" (``profit is $200,000 - $130,000 = $70,000`` passes, ``Possible values:
   12, 15, 18`` does not: it is returned as an ambiguous answer that scores 0).

All scanning is regex- or ``str.find``-based and linear in the completion length; no code is
ever evaluated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Source = Literal["boxed", "hash", "phrase", "tag", "last_number"]

_MAX_ANSWER_CHARS = 2000  # a phrase answer is cut here; boxes are returned whole
_MAX_UNWRAP = 4  # \boxed{\boxed{...}} depth that is unwrapped

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])(\s*)")
_BRACE_RE = re.compile(r"\\.|[{}]", re.S)  # an escaped character (skipped) or a brace
_BOX_TOKEN_RE = re.compile(r"[ \t]+([-+]?\d+(?:[.,]\d+)*(?:/\d+)?)(?![\w\\{])")  # `\boxed 5`: a number, same line
_HASH_ANSWER_RE = re.compile(r"[-+$€£\\(.]|\d(?!\d*[.)]\s+[A-Za-z])")
_PHRASE_RE = re.compile(
    r"(?i)\b(?:final\s+answer(?:\s+is)?\s*[:=]?|answer\s+is\s*:?|answer\s*[:=])[ \t]*"
)
# Sentence scanner for phrase answers: math delimiters, escapes, braces, `$`, newlines and
# sentence-ending punctuation (a `.` followed by a digit is a decimal point, not an end).
_SENT_RE = re.compile(r"\\[()\[\]]|\\.|[{}$\n]|[.!?;](?=\s|$)", re.S)
_NUMBER_RE = re.compile(
    r"(?<![\w.])(?:\\frac\{\d+\}\{\d+\}|-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?)(?![\w])"
)
_SENTENCE_START_RE = re.compile(r"[.!?](?=\s)|\n")
_LEAD_IN_RE = re.compile(
    r"(?i)(?:=|\b(?:is|are|was|were|equals?|be|of|to|makes?|gets?|has|have|had|total|costs?|earns?|pays?|needs?))$"
)
# Prose after an answer (`cut_prose`): a top-level `,`/`;` before a word, a connective, a
# parenthetical remark or a dash; math, braces and brackets are skipped.
_PROSE_RE = re.compile(
    r"\\[()\[\]]|\\.|[{}()\[\]$]"
    r"|[,;][ \t]*(?=(?!(?:and|or)\b)[A-Za-z]{2})"
    r"|(?<![ \t])[ \t]+(?=(?:because|since|as|so|which|that|when|where|if|for|given|while|therefore|thus"
    r"|hence|meaning|i\.e\.|e\.g\.)\b)"
    r"|(?<![ \t])[ \t]+(?=\((?:[A-Za-z]{2}|[a-z] [a-z]))"
    r"|(?<![ \t])[ \t]+(?:--|\u2014|\u2013)[ \t]+(?=[A-Za-z]{2})",
    re.S,
)
_TURN_RE = re.compile(
    r"<\|(?:im_start|im_end|endoftext|eot_id|start_header_id|user|assistant|system|end)\|>"
    r"|<(?:start|end)_of_turn>|\[INST\]|</s>"
)
_QUESTION_RE = re.compile(
    r"(?im)^[ \t>#*_]*(?:question|problem|q|human|user|assistant)(?:[ \t]*\d+)?[ \t]*[*_]*[ \t]*:"
)
_HEDGE_RE = re.compile(
    r"(?i)\b(?:or|either|maybe|perhaps|possibly|probably|unsure|guess)\b|\bnot\s+sure\b"
    r"|\\lor(?![A-Za-z])|\\vee(?![A-Za-z])"
)


@dataclass(frozen=True)
class Extraction:
    """What `extract` found in one completion.

    Attributes:
        answers: distinct candidate answers in order of appearance; empty when there is no
            answer. Only boxes can give more than one (all must be correct to be paid).
        source: which rule found them, or None.
        ambiguous: True when the rule found a hedge it refuses to pick from (lenient mode's
            multi-number final sentence); such a row scores 0.
        truncated: True when the answer was cut off (unclosed ``\\boxed{``, ``<think>`` or a
            bare final ``####``).
    """

    answers: tuple[str, ...] = ()
    source: Source | None = None
    ambiguous: bool = False
    truncated: bool = False

    @property
    def text(self) -> str | None:
        """The extracted answer as logged: the answer, several boxes joined by `` | ``, or None."""
        if not self.answers:
            return None
        return " | ".join(self.answers)


def is_hedged(answer: str) -> bool:
    """True when `answer` hedges between candidates ("12 or 15", "maybe 3", ``a \\lor b``)."""
    return _HEDGE_RE.search(answer) is not None


def strip_reasoning(text: str) -> str | None:
    """Drop ``<think>...</think>`` reasoning; None when a ``<think>`` is never closed."""
    close = text.rfind("</think>")
    if close >= 0:
        return text[close + len("</think>"):]
    if "<think>" in text:
        return None
    return text


def cut_prose(answer: str) -> str:
    """The answer without the prose that follows it in its sentence.

    ``"72, in total, so the farmer earns that much"`` -> ``"72"``; ``"72 because 8 * 9 is
    72"`` -> ``"72"``; ``"40 (the total cost)"`` -> ``"40"``. Cuts only at top level (outside
    ``$...$``, ``\\(...\\)``, braces, parentheses and brackets), never before the first
    character, and never in a hedged answer (``"12 or 18, depending on ..."`` stays whole so
    that the scorer sees the hedge). Lists (``"3, 5, 7"``, ``"x = 2, y = 3"``) are kept.
    Only the first 2,000 characters are scanned (a longer answer is scored wrong anyway).
    """
    limit = min(len(answer), _MAX_ANSWER_CHARS)
    if is_hedged(answer[:limit]):
        return answer
    depth = 0
    in_math = False
    for m in _PROSE_RE.finditer(answer, 0, limit):
        tok = m.group()
        if tok in ("{", "(", "["):
            depth += 1
        elif tok in ("}", ")", "]"):
            depth = max(0, depth - 1)
        elif tok in ("\\(", "\\["):
            in_math = True
        elif tok in ("\\)", "\\]"):
            in_math = False
        elif tok == "$":
            # A `$` with no partner after it is a currency sign, not math.
            in_math = False if in_math else answer.find("$", m.end(), limit) >= 0
        elif tok[0] != "\\" and depth == 0 and not in_math and answer[:m.start()].strip():
            return answer[:m.start()].rstrip()
    return answer


def _cut_turns(text: str) -> str:
    """`text` up to the first chat-turn token that has some text before it."""
    if "<" not in text and "[INST]" not in text:
        return text  # the common case, without a regex scan
    for m in _TURN_RE.finditer(text):
        if text[:m.start()].strip():
            return text[:m.start()]
    return text


def _cut_questions(body: str) -> str:
    """`body` up to its first new-question line when an answer comes before that line;
    otherwise (echoed question/answer blocks) the last block that has an answer.

    A block runs from one question line to the next. Linear: every character is in at most
    two extraction scans.
    """
    if ":" not in body:
        return body  # every question line has a colon
    starts = [m.start() for m in _QUESTION_RE.finditer(body)]
    if not starts:
        return body
    if _extract_body(body[:starts[0]], False).answers:
        return body[:starts[0]]
    for start, end in zip(reversed(starts), reversed(starts[1:] + [len(body)])):
        found = _extract_body(body[start:end], False)
        if found.answers or found.truncated:
            return body[start:end]
    return body


def cut_run_on(text: str) -> str | None:
    """The model's own reply: `text` cut at a new chat turn, reasoning dropped
    (`strip_reasoning`), then cut at a new question that follows an answer.

    Returns None when a ``<think>`` is never closed. Linear in ``len(text)`` (one prefix is
    checked for an answer).
    """
    body = strip_reasoning(_cut_turns(text))
    return None if body is None else _cut_questions(body)


def _match_brace(text: str, open_idx: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at `open_idx`, or None when unbalanced."""
    depth = 0
    for m in _BRACE_RE.finditer(text, open_idx):
        tok = m.group()
        if tok == "{":
            depth += 1
        elif tok == "}":
            depth -= 1
            if depth == 0:
                return m.start()
    return None


def _boxes(text: str) -> tuple[list[str], bool]:
    """Contents of the top-level boxes in order, and whether the last one is unclosed."""
    out: list[str] = []
    pos = 0
    while True:
        m = _BOX_RE.search(text, pos)
        if m is None:
            return out, False
        j = m.end()
        if j < len(text) and text[j] == "{":
            close = _match_brace(text, j)
            if close is None:
                return out, True
            out.append(text[j + 1:close])
            pos = close + 1
        else:
            if j >= len(text):
                return out, True  # `\boxed` is the last thing written
            tok = _BOX_TOKEN_RE.match(text, m.start(1))
            if tok is not None:  # `\boxed 5`
                out.append(tok.group(1))
                pos = tok.end()
            else:
                pos = j  # `\boxed` with no argument (an instruction echoed): not an answer


def unwrap(answer: str) -> str:
    """Strip math delimiters, markdown bold, trailing punctuation and outer boxes.

    ``"$\\boxed{5}$."`` -> ``"5"``. Never raises; returns ``""`` for an empty answer.
    """
    s = answer.strip()
    for _ in range(_MAX_UNWRAP):
        before = s
        s = s.strip().rstrip(".,;:!").strip()
        if s.startswith("**") and s.endswith("**") and len(s) >= 4:
            s = s[2:-2]
        for left, right in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)")):
            if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
                s = s[len(left):-len(right)]
        if s.startswith("$") and s.endswith("$") and len(s) >= 2:
            s = s[1:-1]
        s = s.strip()
        m = _BOX_RE.match(s)
        if m is not None and s[m.end():m.end() + 1] == "{":
            close = _match_brace(s, m.end())
            if close == len(s) - 1:
                s = s[m.end() + 1:close]
        if s.startswith("\\displaystyle"):
            s = s[len("\\displaystyle"):]
        if s == before:
            break
    return s.strip()


def _sentence(text: str, start: int) -> str:
    """The rest of the sentence that starts at `start` (skipping leading blank lines)."""
    end = min(len(text), start + _MAX_ANSWER_CHARS)
    # The answer may start on the next line ("Final answer:\n18").
    while start < end and text[start] in " \t\r\n":
        start += 1
    depth = 0
    in_math = False
    for m in _SENT_RE.finditer(text, start, end):
        tok = m.group()
        if tok == "\n":
            return text[start:m.start()]
        if tok == "{":
            depth += 1
        elif tok == "}":
            depth = max(0, depth - 1)
        elif tok in ("\\(", "\\["):
            in_math = True
        elif tok in ("\\)", "\\]"):
            in_math = False
        elif tok == "$":
            if in_math:
                in_math = False
            else:
                # A `$` with no partner later on the line is a currency sign, not math.
                nl = text.find("\n", m.end(), end)
                line_end = end if nl < 0 else nl
                if text.find("$", m.end(), line_end) >= 0:
                    in_math = True
        elif tok in ".!?;" and depth == 0 and not in_math:
            return text[start:m.start()]
    return text[start:end]


def _last_phrase(text: str) -> tuple[str, int] | None:
    """The answer after the last answer phrase and the end of its anchor, or None."""
    last = None
    for m in _PHRASE_RE.finditer(text):
        last = m
    if last is None:
        return None
    return _sentence(text, last.end()), last.end()


def _last_hash(text: str) -> str | None:
    """Answer after the last answer-like ``####``; ``""`` if the text ends in a bare ``####``.

    Markdown headings (``#### Step 1``, ``#### 1. Compute``) are skipped: a GSM8K answer
    starts with a digit, sign, currency or LaTeX, and is not a numbered title.
    """
    lines = text.rstrip().split("\n")
    for k in range(len(lines) - 1, -1, -1):
        if "####" not in lines[k]:
            continue
        content = unwrap(cut_prose(lines[k].rsplit("####", 1)[1].strip()))
        if not content:
            if k == len(lines) - 1:
                return ""  # cut off right after `####`
            continue
        if _HASH_ANSWER_RE.match(content):
            return content
    return None


def _last_tag(text: str) -> tuple[str, int] | None:
    """Content of the last closed ``<answer>...</answer>`` and its end index, or None."""
    low = text.lower()
    close = low.rfind("</answer>")
    if close < 0:
        return None
    open_ = low.rfind("<answer>", 0, close)
    if open_ < 0:
        return None
    return text[open_ + len("<answer>"):close], close


def _last_number(text: str) -> Extraction:
    """Lenient rule 5: the last number, refused when its sentence hedges."""
    nums = list(_NUMBER_RE.finditer(text))
    if not nums:
        return Extraction()
    last = nums[-1]
    sent_start = 0
    for m in _SENTENCE_START_RE.finditer(text, 0, last.start()):
        sent_start = m.end()
    sentence = text[sent_start:last.end()]
    in_sentence = {m.group().replace(",", "") for m in nums if m.start() >= sent_start}
    lead = text[sent_start:last.start()].rstrip(" \t$\\(*")
    lead = lead[:-1].rstrip() if lead.endswith("\\$") else lead
    if is_hedged(sentence) or (len(in_sentence) > 1 and _LEAD_IN_RE.search(lead) is None):
        return Extraction((sentence.strip(),), "last_number", ambiguous=True)
    return Extraction((last.group(),), "last_number")


def _dedupe(answers: list[str]) -> tuple[str, ...]:
    seen: dict[str, str] = {}
    for a in answers:
        key = re.sub(r"\s+", "", a).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
        seen.setdefault(key, a)
    return tuple(seen.values())


def extract(text: str, lenient: bool = False) -> Extraction:
    """Find the final answer(s) of one completion; see the module docstring for the rules.

    Args:
        text: the completion (any length; only linear-time scans are run on it).
        lenient: also accept the last bare number (rule 5).

    Returns:
        An `Extraction`; ``answers`` is empty when there is no answer. Never raises for a
        `str` input.
    """
    body = cut_run_on(text)
    if body is None:
        return Extraction(truncated=True)
    return _extract_body(body, lenient)


def _extract_body(body: str, lenient: bool) -> Extraction:
    """Rules 2-5 of the module docstring on a completion already cut to the model's reply."""
    boxes, truncated = _boxes(body)
    if truncated:
        return Extraction(truncated=True)
    if boxes:
        answers = _dedupe([a for a in (unwrap(b) for b in boxes) if a])
        return Extraction(answers, "boxed")
    if "####" in body:
        hashed = _last_hash(body)
        if hashed is not None:
            return Extraction((hashed,), "hash") if hashed else Extraction(source="hash", truncated=True)
    plain = body.replace("**", "")
    phrase = _last_phrase(plain)
    tag = _last_tag(plain)
    if phrase is not None or tag is not None:
        if tag is not None and (phrase is None or tag[1] >= phrase[1]):
            inner = tag[0]
            inner_phrase = _last_phrase(inner)
            ans = unwrap(cut_prose(unwrap(inner_phrase[0] if inner_phrase is not None else inner)))
            source: Source = "tag"
        else:
            ans = unwrap(cut_prose(unwrap(phrase[0])))  # type: ignore[index]
            source = "phrase"
        return Extraction((ans,), source) if ans else Extraction(source=source)
    if lenient:
        return _last_number(body)
    return Extraction()


def extract_answer(text: str, lenient: bool = False) -> str | None:
    """The final answer of a completion as a string, or None when it has none.

    Args:
        text: the completion.
        lenient: also accept the last bare number of the text (off by default).

    Returns:
        The answer (LaTeX or plain text, delimiters stripped). When a completion boxes
        several *different* answers they are all returned joined by `` | `` (that is what
        `rewards.reward` logs as ``extracted``; it scores such a completion as correct only if
        every box is). None when there is no answer or it was truncated.

    Raises:
        TypeError: `text` is not a `str`.
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer expects str, got {type(text).__name__}")
    return extract(text, lenient).text


def reference_answer(ref: str) -> str:
    """The answer inside a reference string.

    A plain reference (``"18"``, ``"\\frac{1}{2}"``) is returned with math delimiters
    stripped; a worked solution is reduced to its last complete box or its last ``#### N``
    (TRL's ``solution`` column, GSM8K's ``answer`` column). Returns ``""`` for an empty
    reference.
    """
    s = ref.strip()
    if "\\boxed" in s or "\\fbox" in s:
        boxes, truncated = _boxes(s)
        if boxes and not truncated:
            return unwrap(boxes[-1])
    if "####" in s:
        return unwrap(s.rsplit("####", 1)[1])
    return unwrap(s)
