"""Prefill-only scoring: the log-probability of given target tokens after given prefixes, under many
adapters at once, in one multi-LoRA vLLM batch (``VLLMBackend.prompt_logprobs``).

One scorer serves three uses: the dense reward (log p(reference answer | prompt, the rollout's own
reasoning), Kwiatkowski et al., arXiv 2602.03979, the only likelihood reward that worked in every
setting they tried), the strategy lab's ``likelihood`` landscape (log p(reference solution | prompt)),
and the KL drift estimate of ``essa eval`` (a reference model's sampled continuations rescored by each
adapter; es-awd's estimator).

Prefix and target are tokenised separately and concatenated, so the boundary never merges two
tokens and the target's tokens are the ones scored (VeriFree, arXiv 2505.21493, splits at the
answer tag for the same reason). vLLM has had wrong-mapping bugs on exactly this path (LoRA with
``prompt_logprobs``: vllm issues 16668, 29955, 51594); tests/test_prefill.py checks the scores
against transformers + peft on both LoRA kernel paths.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from engine.backends import AdapterRef

Pair = tuple[list[int], list[int]]
"""(prefix token ids, target token ids): the prefix is context, the target's tokens are scored."""


def encode_pairs(tokenizer, prefixes: Sequence[str], targets: Sequence[str], target_name: str = "target") -> list[Pair]:
    """Token ids of each (prefix text, target text), tokenised apart (no special tokens added: the
    prefix already carries the chat template).

    Args:
        target_name: what the targets are, for the error message (e.g. ``"answer"``).

    Raises:
        ValueError: lengths differ, or a prefix or target encodes to no token (one line: the pair's
            1-based number, what is empty, and the end of the prefix, where the target goes).
    """
    if len(prefixes) != len(targets):
        raise ValueError(f"{len(prefixes)} prefixes but {len(targets)} targets")
    pairs = []
    for i, (prefix, target) in enumerate(zip(prefixes, targets), 1):
        p = tokenizer(prefix, add_special_tokens=False)["input_ids"]
        t = tokenizer(target, add_special_tokens=False)["input_ids"]
        if not p or not t:
            raise ValueError(f"pair {i}: an empty {'prefix' if not p else target_name} cannot be scored (the prefix "
                             f"ends ...{prefix[-40:]!r}, the {target_name} is {target[:40]!r}); every prefix and "
                             f"{target_name} needs at least one token")
        pairs.append((list(p), list(t)))
    return pairs


def encode_answer_pairs(tokenizer, prefixes: Sequence[str], answers: Sequence[str],
                        closes: Sequence[str]) -> list[Pair]:
    """Pairs whose target is an answer's tokens then the first token of its close text (e.g. ``}.``), each
    part tokenised apart so the answer's tokens are the ones scored and the close is the token the rollout
    wrote (rewards/likelihood.py; issue 40 item 2).

    Raises:
        ValueError: lengths differ, or a prefix, answer or close encodes to no token.
    """
    if not len(prefixes) == len(answers) == len(closes):
        raise ValueError(f"{len(prefixes)} prefixes, {len(answers)} answers and {len(closes)} closes")
    pairs = encode_pairs(tokenizer, prefixes, answers, target_name="answer")
    for (_, target), close in zip(pairs, closes):
        ids = tokenizer(close, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"an empty close cannot be scored: {close[:40]!r}")
        target.append(int(ids[0]))
    return pairs


def target_logprobs(backend, pairs: Sequence[Pair], adapters: Sequence[AdapterRef | None],
                    use_tqdm: bool = False) -> list[np.ndarray]:
    """log p of every target token given its prefix and the target tokens before it, per pair.

    Args:
        backend: a back-end with ``prompt_logprobs(token_ids, adapters)`` (``VLLMBackend``).
        pairs: R (prefix ids, target ids), both non-empty.
        adapters: R adapter refs (None = the base model), aligned with ``pairs``.

    Returns:
        R arrays, (T_r,) float64 natural-log probabilities, T_r = len(target ids); the sum is
        log p(target | prefix).
    """
    seqs = [list(p) + list(t) for p, t in pairs]
    lps = backend.prompt_logprobs(seqs, adapters, use_tqdm=use_tqdm)  # entry i: log p(token i+1 | <= i)
    return [np.asarray(lp[len(p) - 1:], dtype=np.float64) for lp, (p, _) in zip(lps, pairs)]
