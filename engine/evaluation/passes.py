"""One decoding pass over A conditions x N problems: every (condition, problem) request in ONE back-end
call (multi-LoRA batch), every completion scored (``essa eval``)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.backends import AdapterRef, Sampling
from engine.tasks import Problem


@dataclass
class PassResult:
    """One decoding pass over A conditions x N problems x G samples.

    Attributes:
        correct: (A, N, G) bool, status ``correct``.
        scored: (A, N, G) bool, status not ``error``.
        extracted: (A, N, G) object, extracted answer or None.
        status: (A, N, G) object, reward status.
        n_tokens: (A, N, G) int64, completion tokens.
        texts: (A, N, G) object, completion texts.
        generate_s: seconds in the back-end's generate call.
        flexible_correct: (A, N, G) bool, status ``correct`` under the flexible reward; None when
            no flexible reward was run.
        flexible_extracted: (A, N, G) object, the flexible reward's extracted answer, or None.
    """

    correct: np.ndarray
    scored: np.ndarray
    extracted: np.ndarray
    status: np.ndarray
    n_tokens: np.ndarray
    texts: np.ndarray
    generate_s: float
    flexible_correct: np.ndarray | None = None
    flexible_extracted: np.ndarray | None = None


def run_pass(backend, reward_fn, prompts: Sequence[str], problems: Sequence[Problem],
             adapters: Sequence[AdapterRef | None], sampling: Sampling, desc: str = "reward",
             chunk: int = 512, flexible_fn=None) -> PassResult:
    """Generate for all A x N (condition, problem) requests in ONE back-end call and score them.

    Args:
        backend: ``generate(prompts, adapters, sampling, use_tqdm) -> list[list[Completion]]``.
        reward_fn: ``f(completions, references) -> list[RewardResult]`` (rewards.MathReward).
        prompts: N chat-templated prompts, aligned with ``problems``.
        adapters: A adapter refs (None = base model).
        sampling: decoding; G = sampling.n samples per request.
        chunk: completions per reward call (one progress-bar step).
        flexible_fn: the flexible reward, same signature as ``reward_fn``; None = none.
    """
    from tqdm.auto import tqdm

    A, N, G = len(adapters), len(problems), sampling.n
    flat_prompts = [p for _ in range(A) for p in prompts]                 # (A*N,) adapter-major
    flat_adapters = [a for a in adapters for _ in range(N)]
    t0 = time.perf_counter()
    outs = backend.generate(flat_prompts, flat_adapters, sampling, use_tqdm=True)
    generate_s = time.perf_counter() - t0
    if len(outs) != A * N or any(len(o) != G for o in outs):
        raise RuntimeError(f"back-end returned {len(outs)} requests for {A * N}, expected {G} completions each")
    texts = [c.text for o in outs for c in o]                             # (A*N*G,)
    refs = [problems[(i // G) % N].answer for i in range(len(texts))]
    results, flexible = [], []
    for s in tqdm(range(0, len(texts), chunk), desc=desc, unit="chunk", leave=False):
        results.extend(reward_fn(texts[s:s + chunk], refs[s:s + chunk]))
        if flexible_fn is not None:
            flexible.extend(flexible_fn(texts[s:s + chunk], refs[s:s + chunk]))
    status = np.array([r.status for r in results], dtype=object).reshape(A, N, G)

    def objects(values) -> np.ndarray:                                    # (A, N, G) object
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        return arr.reshape(A, N, G)

    flex_correct = flex_extracted = None
    if flexible_fn is not None:
        flex_correct = np.array([r.status == "correct" for r in flexible], dtype=bool).reshape(A, N, G)
        flex_extracted = objects([r.extracted for r in flexible])
    n_tokens = np.array([c.n_tokens for o in outs for c in o]).reshape(A, N, G)
    return PassResult(correct=status == "correct", scored=status != "error",
                      extracted=objects([r.extracted for r in results]), status=status, n_tokens=n_tokens,
                      texts=objects(texts), generate_s=generate_s, flexible_correct=flex_correct,
                      flexible_extracted=flex_extracted)
