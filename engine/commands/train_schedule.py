"""``essa train``'s schedule: each generation's sampling, when a validation is due, and whether the next
generation fits ``deadline_s``. Pure functions of the config and the clock (no engine), so a resumed
run decides exactly as an uninterrupted one (STYLE.md rule 11)."""
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


def deadline_allows(cfg, g: int, elapsed_s: float, generation_s: float, tokens_per_completion: float,
                    tokens_per_s: float, n_val: int, condition_s: float | None = None) -> bool:
    """Whether generation ``g`` may run under ``cfg.deadline_s``, decided right after generation
    ``g - 1`` ended, ``elapsed_s`` seconds after the command started.

    The projection: this invocation's slowest generation so far (``generation_s``), plus the
    held-out validations still to come: the periodic ones due after ``g - 1`` (not run yet: it is
    skipped when the run stops, the final call covers it) and after ``g`` (the mean genome), and the
    final call (the SFT warm start when ``eval.baselines``, the mean and the best genome, and with
    ``eval.samples`` the sampled pass of the warm start and the mean). A validation condition is priced
    from the last generation: ``n_val`` problems x ``tokens_per_completion`` (capped at
    ``eval.max_tokens``) / ``tokens_per_s``, or, when a validation of this invocation was timed,
    ``condition_s`` seconds each (the only price under ``rollout.fitness=likelihood``, whose generations
    decode nothing); the sampled pass as 2 x ``sample_problems`` x ``samples`` completions. Why: ``make run``
    must end within its wall-clock limit on a slow CPU too (issue 10: fp32 on AVX2 generates ~160
    tok/s against ~650 with native bf16), and the final table is what the user waits for.
    """
    if cfg.deadline_s is None:
        return True
    periodic = int(g > 0 and periodic_validation_due(g - 1, cfg, 0.0)) + int(periodic_validation_due(g, cfg, 0.0))
    conditions = int(bool(cfg.eval.baselines)) + 2 + periodic
    completions = conditions * n_val + 2 * min(cfg.eval.sample_problems, n_val) * cfg.eval.samples
    if condition_s is not None:
        val_s = condition_s * completions / max(n_val, 1)
    else:
        val_s = completions * min(tokens_per_completion, cfg.eval.max_tokens) / max(tokens_per_s, 1e-9)
    return elapsed_s + generation_s + val_s <= cfg.deadline_s
