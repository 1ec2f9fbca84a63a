"""How many prompts a generation spends: adaptive prompts per generation, driven by the ranking's signal.

RA-CMA-ES (Uchida et al., arXiv 2405.11471) sets re-evaluations from the agreement of two half-sample
update directions; the engine's analogue is the split-half rank correlation of candidate fitness
(``engine.results.stats.split_half_rank_correlation``): spend more prompts only while the ranking is noise.
"""
from __future__ import annotations


def next_prompts(rollout, n: int, rho: float) -> int:
    """The next generation's N under ``rollout.adaptive_prompts``: twice ``n`` (capped) after a generation
    whose ranking was noise (split-half rho below ``rollout.noise_rho``, or NaN), half (not below
    ``prompts_per_generation``) after one with signal; ``n`` when adaptive prompts are off."""
    if not rollout.adaptive_prompts:
        return n
    if not rho >= rollout.noise_rho:  # NaN counts as noise
        return min(2 * n, rollout.max_prompts_per_generation)
    return max(n // 2, rollout.prompts_per_generation)
