"""``essa train``'s schedule: each generation's sampling, when a validation is due, and what fits
``deadline_s`` (the next generation, a periodic validation, the final call's extras). Pure functions of
the config and the clock (no engine), so a resumed run decides exactly as an uninterrupted one (STYLE.md
rule 11)."""
from __future__ import annotations

from engine.backends import Sampling


def generation_sampling(rollout, seed: int, generation: int) -> Sampling:
    """Decoding settings of a generation's rollouts (the ``rollout`` group), one for all its candidates
    and the centre: with ``rollout.common_seeds`` they sample each prompt with the same seeds (a paired
    comparison); the base seed derives from (seed, generation), so a resumed run draws what an
    uninterrupted one does."""
    return Sampling(max_tokens=rollout.max_tokens, temperature=rollout.temperature, top_p=rollout.top_p,
                    n=rollout.samples_per_prompt, seed=seed * 1_000_003 + generation * 10_007,
                    common_seeds=rollout.common_seeds)


def periodic_validation_due(g: int, cfg, wall_s: float) -> bool:
    """Whether the held-out validation of the mean genome runs after generation ``g`` (at step g + 1).

    Every ``eval.every`` generations, except after the last one and after a generation that ended
    past ``time_budget_s`` (``wall_s`` seconds into the run): the final validation covers those.
    """
    over = cfg.time_budget_s is not None and wall_s >= cfg.time_budget_s
    last = g == cfg.generations - 1 or over
    return bool(not last and cfg.eval.every and (g + 1) % cfg.eval.every == 0)


def condition_price_s(cfg, n_val: int, tokens_per_completion: float, tokens_per_s: float,
                      condition_s: float | None = None) -> float:
    """Projected seconds of one held-out validation condition (``n_val`` greedy completions): the
    measured ``condition_s`` when a validation of this invocation was timed (the only price under
    ``rollout.fitness=likelihood``, whose generations decode nothing), else priced from the last
    generation: ``n_val`` x ``tokens_per_completion`` (capped at ``eval.max_tokens``) / ``tokens_per_s``."""
    if condition_s is not None:
        return condition_s
    return n_val * min(tokens_per_completion, cfg.eval.max_tokens) / max(tokens_per_s, 1e-9)


def generations_that_fit(cfg, g: int, elapsed_s: float, generation_s: float, condition_s: float,
                         first_s: float = 0.0) -> int:
    """How many of generations ``g``, ``g + 1``, ... (at most the ``cfg.generations - g`` left) end by
    ``cfg.deadline_s`` together with the final call's paired test (the SFT warm start when
    ``eval.baselines``, the mean and the best genome: ``condition_s`` each), ``elapsed_s`` seconds after
    the command started, each generation taking ``generation_s`` and ``first_s`` spent before them."""
    left = cfg.deadline_s - elapsed_s - first_s - (int(bool(cfg.eval.baselines)) + 2) * condition_s
    return max(0, min(cfg.generations - g, int(left // max(generation_s, 1e-9))))


def deadline_allows(cfg, g: int, elapsed_s: float, generation_s: float, condition_s: float) -> bool:
    """Whether generation ``g`` may run under ``cfg.deadline_s``, decided right after generation
    ``g - 1`` ended, ``elapsed_s`` seconds after the command started: this invocation's slowest
    generation so far (``generation_s``) and then the final call's paired test (``condition_s`` per
    condition, :func:`condition_price_s`) must end by the deadline. Nothing else is reserved: a periodic
    validation runs only if it costs no generation (:func:`periodic_validation_fits`), a base model score
    missing from the cache and the sampled pass run after the final call only if they still fit
    (:func:`fits_deadline`). Why: ``make run`` must end within its wall-clock limit on a slow CPU too
    (issue 10: fp32 on AVX2 generates ~160 tok/s against ~650 with native bf16), and spend its minutes on
    evolution there (issue 26): the final table is what the user waits for, the rest are extras."""
    return cfg.deadline_s is None or generations_that_fit(cfg, g, elapsed_s, generation_s, condition_s) >= 1


def periodic_validation_fits(cfg, g: int, elapsed_s: float, generation_s: float, condition_s: float) -> bool:
    """Whether the periodic validation due before generation ``g`` (one condition, the mean genome) may
    run under ``cfg.deadline_s``: only if as many of the generations left still fit after it as without
    it (:func:`generations_that_fit`), so it never costs a generation (issue 26)."""
    if cfg.deadline_s is None:
        return True
    with_it = generations_that_fit(cfg, g, elapsed_s, generation_s, condition_s, first_s=condition_s)
    return with_it == generations_that_fit(cfg, g, elapsed_s, generation_s, condition_s)


def sampled_pass_s(cfg, condition_s: float, n_val: int) -> float:
    """Projected seconds of the final sampled pass: the warm start and the mean genome,
    ``eval.sample_problems`` x ``eval.samples`` completions each, at ``condition_s`` seconds per ``n_val``
    completions (the final greedy call's measured rate)."""
    return condition_s * 2 * min(cfg.eval.sample_problems, n_val) * cfg.eval.samples / max(n_val, 1)


LONE_CONDITION_FACTOR = 1.5
"""The base model's late score, one condition in a call of its own, priced at this many times a condition of
the final call: alone it fills the batch less, and without the warm start's answer format it writes longer
answers (`make run` on a 2-core AMD EPYC, no AMX: 70 s alone against 55 s per condition of the final call,
which the unscaled price let start with 64 s left; the command, report included, ended 12 s past ``deadline_s``).
Calibrated on a final call of three conditions only; where it holds two or four, a condition's share differs."""


def base_model_price_s(condition_s: float) -> float:
    """Projected seconds of the base model's late held-out score (:data:`LONE_CONDITION_FACTOR` x a final-call
    condition's ``condition_s``)."""
    return LONE_CONDITION_FACTOR * condition_s


def fits_deadline(cfg, elapsed_s: float, need_s: float) -> bool:
    """Whether ``need_s`` more seconds, ``elapsed_s`` after the command started, end by ``cfg.deadline_s``
    (always, without one): the test for the final call's extras (base model score, sampled pass), which
    run after the paired test only if they still fit, so they never cost a generation (issue 26)."""
    return cfg.deadline_s is None or elapsed_s + need_s <= cfg.deadline_s
