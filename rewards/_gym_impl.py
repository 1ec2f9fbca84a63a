"""A reasoning-gym dataset's own verifier (``score_answer``), run only inside pool workers (`rewards._pool`).

reasoning-gym (https://github.com/open-thought/reasoning-gym) scores an answer against a dataset
*entry* (the generated item: ``question``, ``answer``, ``metadata``). A reward gets only the
reference string (`rewards.GymReward`'s call signature is `rewards.MathReward`'s), so the entry is
rebuilt from it here: ``{"answer": ref}`` is all that ``score_answer`` reads for the arithmetic
datasets; countdown's reads ``metadata.numbers`` and ``metadata.target``, which its reference (one
solving expression that uses every number once) determines: the integers in it and its value.
tests/test_gym_reward.py checks that the rebuilt entries score like the generated ones.

Some verifiers evaluate the answer (countdown calls sympy's ``parse_expr``, which uses ``eval``):
they run in a worker process with a hard time limit and an address-space cap, never in the caller.
Importing this module imports reasoning-gym and sympy (about a second).
"""

from __future__ import annotations

import re
from functools import lru_cache

_INT = re.compile(r"\b\d+\b")


@lru_cache(maxsize=None)
def _dataset(name: str):
    """One instance of dataset ``name`` (``score_answer`` does not depend on its size or seed)."""
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=1, seed=0)


def _countdown_entry(ref: str) -> dict:
    """Countdown's entry from its reference expression: the numbers it uses and its value (the target)."""
    from sympy.parsing.sympy_parser import parse_expr

    value = parse_expr(ref)  # the reference is generated data, never a completion
    if not value.is_number:
        raise ValueError(f"countdown reference {ref!r} is not an arithmetic expression")
    target = float(value)
    return {"answer": ref, "metadata": {"numbers": [int(m) for m in _INT.findall(ref)],
                                        "target": int(target) if target.is_integer() else target}}


ENTRIES = {"countdown": _countdown_entry}
"""dataset -> the entry ``score_answer`` needs, rebuilt from the reference; default ``{"answer": ref}``."""


def entry(dataset: str, ref: str) -> dict:
    """The reasoning-gym entry of reference ``ref`` of ``dataset`` (what its ``score_answer`` reads).

    Raises:
        ValueError / SyntaxError / TypeError: a reference the dataset's entry cannot be built from.
    """
    build = ENTRIES.get(dataset)
    return build(ref) if build else {"answer": ref, "metadata": {}}


def score(answer: str | None, dataset: str, ref: str) -> float | str:
    """``score_answer(answer, entry)`` of ``dataset``: a float in [0, 1] (1 = correct), or ``"ref_error"``
    when no entry can be built from ``ref``. Runs without a time limit: call it only in a pool worker."""
    if not isinstance(ref, str) or not ref.strip():
        return "ref_error"
    try:
        item = entry(dataset, ref)
    except Exception:  # noqa: BLE001 - a reference that is not what the dataset generates
        return "ref_error"
    return float(_dataset(dataset).score_answer(answer, item))


def warm_up() -> None:
    """Import reasoning-gym and sympy's parser before the worker reports ready (a second or two)."""
    score("1 + 2", "countdown", "2 + 1")
