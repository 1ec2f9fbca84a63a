"""Where the dense reward scores a rollout: the rollout's own reasoning up to its answer, then the
reference answer.

The dense reward is log p(reference answer | prompt, the rollout's own reasoning) (Kwiatkowski et al.,
arXiv 2602.03979: of binary, probability, average probability, VeriFree, JEPO, log-probability and
average log-probability rewards, only this one worked in every setting they tried). This module only
cuts the texts; the engine scores them prefill-only (engine/evaluation/prefill.py).
"""
from __future__ import annotations

BOX = "\\boxed{"
ANSWER_LEAD = "\nThe final answer is \\boxed{"
"""Appended to a rollout that never opened a box: the answer format the warm start teaches."""


def answer_context(completion: str, reference: str) -> tuple[str, str]:
    """(context, target) for one rollout: the completion up to and including its last ``\\boxed{``
    (what it reasoned before answering), or the whole completion plus ``ANSWER_LEAD`` when it opened
    no box; the target is the reference answer and the closing brace.

    Args:
        completion: the rollout's text (after the prompt).
        reference: the reference final answer (plain, e.g. ``"42"``).

    Returns:
        ``(context, target)``; the prompt goes before ``context``.
    """
    i = completion.rfind(BOX)
    context = completion[: i + len(BOX)] if i >= 0 else completion.rstrip() + ANSWER_LEAD
    return context, f"{reference.strip()}}}"
