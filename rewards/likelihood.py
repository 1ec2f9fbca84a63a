"""Where the dense reward scores a rollout: the rollout's own reasoning up to its answer, then the
reference answer and the rollout's own closing brace.

The dense reward is log p(reference answer | prompt, the rollout's own reasoning) (Kwiatkowski et al.,
arXiv 2602.03979: of binary, probability, average probability, VeriFree, JEPO, log-probability and
average log-probability rewards, only this one worked in every setting they tried). This module only
cuts the texts; the engine tokenises and scores them prefill-only (engine/evaluation/prefill.py).

The brace that ends the answer is scored as the rollout wrote it: a model writes ``}.`` as one token
(SmolLM2: p about 0.98 after a boxed answer), so scoring a lone ``}`` (a token it does not write there)
would measure the brace, not the answer (issue 40 item 2: 4.1 nats on average on real splices).
"""
from __future__ import annotations

BOX = "\\boxed{"
ANSWER_LEAD = "\nThe final answer is \\boxed{"
"""Appended to a rollout that never opened a box: the answer format the warm start teaches."""
DEFAULT_CLOSE = "}."
"""The close scored where the rollout wrote none (no box, or a box left open): the taught format's ``}.``."""


def closing_text(completion: str, start: int) -> str:
    """The text from the brace that closes the box opened just before ``start`` (brace depth counted, so
    ``\\frac{1}{2}`` inside the box is skipped) to the end of the completion; :data:`DEFAULT_CLOSE` when
    the box is never closed. The scorer keeps its first token (e.g. ``}.``)."""
    depth = 1
    for j in range(start, len(completion)):
        depth += {"{": 1, "}": -1}.get(completion[j], 0)
        if depth == 0:
            return completion[j:]
    return DEFAULT_CLOSE


def answer_context(completion: str, reference: str) -> tuple[str, str, str]:
    """(context, answer, close) for one rollout: the completion up to and including its last ``\\boxed{``
    (what it reasoned before answering), or the whole completion plus ``ANSWER_LEAD`` when it opened no
    box; the reference answer; the text the rollout closed its box with (:func:`closing_text`), or
    ``DEFAULT_CLOSE``.

    Args:
        completion: the rollout's text (after the prompt).
        reference: the reference final answer (plain, e.g. ``"42"``).

    Returns:
        ``(context, answer, close)``; the prompt goes before ``context``; the scored target is the
        answer's tokens then the first token of ``close``.

    Raises:
        ValueError: ``reference`` is empty or whitespace (there is nothing to score).
    """
    if not reference.strip():
        raise ValueError(f"the reference answer is empty ({reference!r}): the dense reward scores log p(reference "
                         f"answer), so every problem needs a non-empty answer; check the task's answer field")
    i = completion.rfind(BOX)
    if i < 0:
        return completion.rstrip() + ANSWER_LEAD, reference.strip(), DEFAULT_CLOSE
    return completion[: i + len(BOX)], reference.strip(), closing_text(completion, i + len(BOX))
