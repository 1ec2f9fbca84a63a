"""The numerics floor of a population's fitness: identical adapters in one multi-LoRA batch (issue 42).

ESSA ranks candidates by small fitness differences (ESSA §3.3), so any difference the genome did not
make is noise the strategy cannot see. A *placebo generation* writes P byte-identical copies of one
adapter under P adapter ids and scores them exactly as a generation is scored (one ``generate`` call,
the same N prompts): whatever differs between the copies comes from where each request sat in the
batch (kernel blocking that follows the batch's row count, split reductions, the slot's LoRA group).
A second probe scores a few requests alone against the same requests inside the full batch.

On the CPU with AMX in bf16 the copies disagreed on 7 % of verdict pairs (issue 42); in float32 and on
AVX-512 BF16 without AMX they agree almost everywhere. docs/results/numerics.md has the table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.backends import Sampling
from engine.results.stats import numerics_share, one_text_share, pairwise_discordance, prompts_disagreeing
from engine.tasks import Problem


@dataclass
class PlaceboResult:
    """What a placebo generation shows.

    Attributes:
        population: P copies. prompts: N.
        fitness_std: standard deviation of the P copies' fitness (mean reward), population formula.
        fitness_var: its square.
        prompts_disagreeing: prompts on which the copies' verdicts differ (count of N).
        pairwise_discordance: mean share of prompts on which two copies' verdicts differ (0 = invariant).
        one_text_share: share of prompts on which every copy wrote the same text (1 = invariant).
        alone_same: of the probed requests, how many wrote the same text alone (batch of one) as in
            the full batch; ``alone_probed`` how many were probed (0 = not probed).
        tokens: completion tokens of the placebo call. generate_s: its seconds.
    """

    population: int
    prompts: int
    fitness_std: float
    fitness_var: float
    prompts_disagreeing: int
    pairwise_discordance: float
    one_text_share: float
    alone_same: int = 0
    alone_probed: int = 0
    tokens: int = 0
    generate_s: float = 0.0

    def as_dict(self) -> dict:
        """JSON-ready fields."""
        return dict(self.__dict__)

    def line(self) -> str:
        """One log line."""
        alone = f", alone = in batch {self.alone_same}/{self.alone_probed}" if self.alone_probed else ""
        return (f"placebo P {self.population} x N {self.prompts}: fitness std {self.fitness_std:.4f}, "
                f"{self.prompts_disagreeing} prompts disagree, pairwise discordance {self.pairwise_discordance:.3f}, "
                f"one text on {100 * self.one_text_share:.0f} % of prompts{alone}")


def placebo_stats(rewards: np.ndarray, texts: list[list[str]]) -> PlaceboResult:
    """The placebo measures of a generation's rewards (P, N[, G]) and first-sample texts [P][N]."""
    r = np.asarray(rewards, dtype=float)
    fit = np.nanmean(r.reshape(r.shape[0], -1), axis=1)
    return PlaceboResult(population=r.shape[0], prompts=r.shape[1], fitness_std=float(np.nanstd(fit)),
                         fitness_var=float(np.nanvar(fit)), prompts_disagreeing=prompts_disagreeing(r),
                         pairwise_discordance=pairwise_discordance(r), one_text_share=one_text_share(texts))


def placebo_generation(evaluator, genome: np.ndarray, population: int, problems: Sequence[Problem],
                       sampling: Sampling, generation: int, alone: int = 0) -> PlaceboResult:
    """Score ``population`` copies of one genome as one generation, then ``alone`` of its requests alone.

    Args:
        evaluator: a :class:`engine.evaluation.population.PopulationEvaluator` (its codec decodes ``genome``).
        genome: (D,) float64, the adapter every copy is.
        population: P >= 2 copies, each written as its own adapter (own id, identical bytes).
        problems: the N prompts of the generation.
        sampling: decoding settings (greedy in training).
        generation: adapter-id namespace; ``generation + 1`` is used by the alone probe.
        alone: how many of the first problems to also generate as a batch of one with copy 0's weights
            (a fresh id), compared with copy 0's text in the full batch.

    Returns:
        :class:`PlaceboResult`.

    Raises:
        ValueError: ``population`` < 2.
    """
    if population < 2:
        raise ValueError(f"placebo population={population}: needs at least 2 copies")
    genomes = np.tile(np.asarray(genome, dtype=float)[None, :], (population, 1))
    result = evaluator.evaluate(genomes, problems, generation, sampling, use_tqdm=False)
    N = len(problems)
    texts = [[result.rollouts["completion"][(p * N + n) * sampling.n] for n in range(N)] for p in range(population)]
    out = placebo_stats(result.rewards, texts)
    out.tokens, out.generate_s = result.tokens, result.timings.get("generate", 0.0)
    if alone > 0:
        out.alone_probed = min(alone, N)
        out.alone_same = alone_matches(evaluator, genome, problems[:out.alone_probed], sampling, generation + 1,
                                       [texts[0][n] for n in range(out.alone_probed)])
    return out


def alone_matches(evaluator, genome: np.ndarray, problems: Sequence[Problem], sampling: Sampling,
                  generation: int, in_batch: list[str]) -> int:
    """How many of ``problems``, each generated alone (a batch of one request) with ``genome``'s adapter,
    write the text ``in_batch`` holds for them (their text inside a full batch)."""
    refs = evaluator.write_candidates(np.asarray(genome, dtype=float)[None, :], generation)
    try:
        same = 0
        for problem, text in zip(problems, in_batch):
            _, completions, _, _ = evaluator.score(refs, [problem], sampling, use_tqdm=False)
            same += completions[0][0][0].text == text
        return same
    finally:
        evaluator.release(generation)


def share_line(placebo_var: float, population_var: float) -> str:
    """How much of a real population's fitness variance the placebo shows too, in words."""
    share = numerics_share(placebo_var, population_var)
    if not np.isfinite(share):
        return "numerics share: n/a (the population's fitness has no variance)"
    return f"numerics share {100 * share:.0f} % of the population's fitness variance"
