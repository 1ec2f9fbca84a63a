"""The lab's loop: a strategy setting on a landscape, for G generations and several seeds, in one process.

One generation, as ``essa train`` runs it (engine/commands/train.py ``generation``; docs/ARCHITECTURE.md's
data flow, with the landscape in place of vLLM and the reward)::

    genomes = strategy.ask()                                          # (P, D)
    rewards, dense = landscape.evaluate([genomes; mean], seed, g, N)  # (P + 1, N, 1) each: the centre on the same prompts
    fitness = shaped_fitness(EvalResult(rewards, dense), P, aggregate, rollout.dense, rollout.dense_weight)  # (P,)
    strategy.tell(genomes, fitness); strategy.shrink_mean(1 - strategy.mean_decay)
    N = next_prompts(rollout, N, split_half_rho(rewards[:P]))         # rollout.adaptive_prompts

with essa train's own functions for the shaping (engine.evaluation.population: mean or question_z, then
the dense tie-break or weighted term) and the next N (engine.search.budget), and one row of diagnostics
per generation (:data:`COLUMNS`) computed with the functions ``essa train`` logs with
(engine/results/stats.py). ``budget_evaluations`` stops a seed before the first generation that would
spend more candidate x problem evaluations than that in all (equal-evaluation comparisons).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from engine.config import SignalConfig
from engine.lab.base import Landscape
from engine.lab.threads import one_blas_thread
from engine.results.stats import prompts_disagreeing, split_half_rank_correlation, variance_ratio

COLUMNS = {
    "setting": "index of the setting in the run (0 = the reference)",
    "label": "the setting's name (its overrides)",
    "strategy": "strategy name (strategy.name or _target_)",
    "seed": "run seed: the strategy's seed and the minibatch stream's",
    "generation": "0-based generation",
    "prompts": "N of this generation (rollout.adaptive_prompts moves it; else landscape.prompts)",
    "evaluations": "candidate x problem evaluations told so far, sum of P N over the generations (the centre "
                   "is not counted)",
    "true_fitness": "the landscape's true fitness of the strategy mean after this generation (minibatch: "
                    "expected accuracy; classic: -f)",
    "held_out": "held-out accuracy of the mean after this generation (NaN without a held-out set)",
    "fitness_mean": "minibatch fitness (mean reward) of the population: mean over the P candidates",
    "fitness_max": "... its maximum",
    "fitness_center": "minibatch fitness of the mean that asked this generation, on the same problems",
    "sigma": "strategy step size after this generation",
    "mean_norm": "|mean genome| after this generation",
    "split_half_rho": "Spearman correlation of candidate fitness between even and odd problems (NaN: N < 2)",
    "variance_ratio": "candidate fitness variance over the binomial variance at the population mean",
    "prompts_disagreeing": "problems on which the candidates' rewards differ",
    "told_split_half_rho": "split-half rank correlation of the fitness the strategy is told (each half shaped "
                           "on its own: rollout.dense, aggregate); = split_half_rho when both are plain means",
    "dense_mean": "mean dense score of the candidates, nats (NaN with rollout.dense=off)",
    "dense_center": "dense score of the centre, nats (NaN with rollout.dense=off)",
    "dense_split_half_rho": "split-half rank correlation of the candidates' dense scores (NaN with rollout.dense=off)",
}
"""The columns of lab.parquet, one row per setting x seed x generation."""


@dataclass
class Rollout(SignalConfig):
    """The lab's ``rollout`` levers (engine/config.py ``SignalConfig``: essa train's ``rollout`` fields and
    defaults) with the starting N, the object ``engine.search.budget.next_prompts`` reads.

    Attributes:
        prompts_per_generation: the starting (and smallest adaptive) N: the lab's ``landscape.prompts``.
    """

    prompts_per_generation: int = 64


@dataclass
class Setting:
    """One strategy setting to run.

    Attributes:
        label: its name in tables and figures. strategy: the strategy's name. strategy_cls: the class.
        population_size, sigma0, options: the strategy's arguments (``strategy`` group).
        landscape: the built landscape (its dim is D). generations: G. aggregate: ``mean`` or
        ``question_z``. overrides: what distinguishes it from the base config (for the summary).
        mean_decay: ``strategy.mean_decay``: after every tell the mean moves this fraction of the way back
        to genome zero (``Strategy.shrink_mean``, as essa train does); 0 = off.
        rollout: the dense reward and adaptive prompts (:class:`Rollout`; None = off, N = landscape.prompts).
        budget_evaluations: stop a seed before a generation that would take its candidate x problem
        evaluations past this (None = run all G).
        genome: the genome it searches against the one essa train would (engine/lab/genome.py
        ``LabGenome.summary``: kind, alpha, mode, run_dim, dim, model, as_run, note); None = not known.
    """

    label: str
    strategy: str
    strategy_cls: type
    population_size: int
    sigma0: float
    options: dict
    landscape: Landscape
    generations: int
    aggregate: str = "mean"
    overrides: dict = field(default_factory=dict)
    mean_decay: float = 0.0
    rollout: Rollout | None = None
    budget_evaluations: int | None = None
    genome: dict | None = None

    def rollout_or_default(self) -> Rollout:
        """:attr:`rollout`, or essa train's defaults (dense off, fixed N) at the landscape's N."""
        return self.rollout or Rollout(prompts_per_generation=int(self.landscape.prompts))


@dataclass
class SeedResult:
    """One (setting, seed): its rows, the held-out rewards of the start (genome zero) and of the final mean
    ((n,) or None), the true fitness of the start, and the final mean genome (D,)."""

    rows: list[dict]
    held_out_start: np.ndarray | None
    held_out_final: np.ndarray | None
    true_start: float
    mean: np.ndarray


def _signal(rewards: np.ndarray, binary: bool) -> dict:
    """The signal diagnostics of one generation's population rewards (P, N, 1): the split-half rank
    correlation (NaN when N < 2), the variance ratio and the disagreement count (NaN unless 0/1)."""
    nan = float("nan")
    return {"split_half_rho": split_half_rank_correlation(rewards),
            "variance_ratio": variance_ratio(rewards) if binary else nan,
            "prompts_disagreeing": float(prompts_disagreeing(rewards)) if binary else nan}


def shape(rewards: np.ndarray, dense: np.ndarray | None, P: int, aggregate: str, rollout: Rollout) -> np.ndarray:
    """The (P,) fitness the strategy is told, by essa train's ``shaped_fitness`` (engine/evaluation/population.py):
    rewards (P [+ centre], N, 1), dense (same shape, nats) or None; the centre's rows are left out."""
    from engine.evaluation.population import EvalResult, aggregate_fitness, shaped_fitness

    result = EvalResult(aggregate_fitness(rewards), rewards, {}, dense=dense)
    return shaped_fitness(result, P, aggregate, rollout.dense, rollout.dense_weight)


def dense_signal(rewards: np.ndarray, dense: np.ndarray | None, P: int, aggregate: str, rollout: Rollout) -> dict:
    """Diagnostics of what the strategy is told, from rewards and dense scores (P + 1, N, 1) (the centre last):
    the split-half rho of the shaped fitness (each half of the problems shaped on its own, as if it were the
    whole minibatch), and with a dense score its mean over the candidates, the centre's, its split-half rho."""
    nan = float("nan")
    halves = [shape(rewards[:, h::2], None if dense is None else dense[:, h::2], P, aggregate, rollout)
              for h in (0, 1)] if rewards.shape[1] >= 2 else None
    told = nan if halves is None else split_half_rank_correlation(np.stack(halves, axis=1))  # (P, 2): one per half
    if dense is None:
        return {"told_split_half_rho": told, "dense_mean": nan, "dense_center": nan, "dense_split_half_rho": nan}
    per = dense.reshape(len(dense), -1).mean(axis=1)  # (P + 1,)
    return {"told_split_half_rho": told, "dense_mean": float(per[:P].mean()),
            "dense_center": float(per[P]) if len(per) > P else nan,
            "dense_split_half_rho": split_half_rank_correlation(dense[:P])}


def _held_out_accuracy(landscape: Landscape, x: np.ndarray) -> float:
    """Held-out accuracy of genome x after a generation; NaN without a held-out set, or where the landscape
    scores it only at the start and the end (a real model)."""
    r = landscape.held_out(x) if landscape.held_out_each_generation else None
    return float("nan") if r is None else float(np.mean(r))


def generation(s: Setting, strategy, seed: int, g: int, prompts: int, spent: int) -> dict:
    """Run generation ``g`` of ``strategy`` on ``s.landscape`` with N = ``prompts``, after ``spent``
    evaluations, and return its row (:data:`COLUMNS`)."""
    P, land, rollout = s.population_size, s.landscape, s.rollout_or_default()
    centre = strategy.checked_mean()
    genomes = strategy.ask()  # (P, D)
    variable = prompts if land.variable_prompts else None
    rewards, dense = land.evaluate(np.vstack([genomes, centre]), seed, g, variable, rollout.dense != "off")  # (P + 1, N, 1)
    pop = rewards[:P]
    strategy.tell(genomes, shape(rewards, dense, P, s.aggregate, rollout))
    if s.mean_decay:
        strategy.shrink_mean(1.0 - s.mean_decay)
    fit = pop.reshape(P, -1).mean(axis=1)  # logged fitness is the mean reward, as in essa train
    mean = strategy.checked_mean()
    return {"setting": 0, "label": s.label, "strategy": s.strategy, "seed": seed, "generation": g,
            "prompts": pop.shape[1], "evaluations": spent + P * pop.shape[1], "true_fitness": land.true_fitness(mean),
            "held_out": _held_out_accuracy(land, mean), "fitness_mean": float(fit.mean()),
            "fitness_max": float(fit.max()), "fitness_center": float(rewards[P].mean()),
            "sigma": float(strategy.sigma), "mean_norm": float(np.linalg.norm(mean)), **_signal(pop, land.binary),
            **dense_signal(rewards, dense, P, s.aggregate, rollout)}


def run_seed(s: Setting, seed: int, tick: Callable[[int], None] = lambda k: None) -> SeedResult:
    """All G generations of setting ``s`` with run seed ``seed`` (strategy seed and minibatch stream); fewer
    when ``s.budget_evaluations`` is spent first. N starts at ``rollout.prompts_per_generation`` and follows
    ``engine.search.budget.next_prompts`` (fixed unless ``rollout.adaptive_prompts``).

    Raises:
        ValueError: the strategy class rejects its arguments or options (one line).
    """
    from engine.search.budget import next_prompts

    land, rollout = s.landscape, s.rollout_or_default()
    strategy = s.strategy_cls(dim=land.dim, x0=None, seed=seed, population_size=s.population_size,
                              sigma0=s.sigma0, **s.options)
    centre = strategy.checked_mean()
    start, true_start = land.held_out(centre), land.true_fitness(centre)
    rows, n, spent = [], int(rollout.prompts_per_generation), 0
    for g in range(s.generations):
        if s.budget_evaluations is not None and spent + s.population_size * n > s.budget_evaluations:
            tick(s.generations - g)  # the budget is spent: the bar counts the generations not run
            break
        rows.append(generation(s, strategy, seed, g, n, spent))
        spent = rows[-1]["evaluations"]
        n = next_prompts(rollout, n, rows[-1]["split_half_rho"])
        tick(1)
    centre = strategy.checked_mean()
    return SeedResult(rows, start, land.held_out(centre), true_start, centre)


def run_settings(settings: list[Setting], seeds: list[int],
                 progress: bool = True) -> tuple[list[list[SeedResult]], float]:
    """Every setting on every seed, one process, one progress bar over settings x seeds x generations,
    with one BLAS thread (engine/lab/threads.py).

    Returns:
        ``(results[setting][seed index], wall seconds)``; each row's ``setting`` is its index.
    """
    from tqdm import tqdm

    total = sum(s.generations for s in settings) * len(seeds)
    t0 = time.perf_counter()
    out = []
    with one_blas_thread(), tqdm(total=total, disable=not progress, desc="lab", unit="gen", leave=False) as bar:
        for k, s in enumerate(settings):
            per_seed = [run_seed(s, seed, bar.update) for seed in seeds]
            for res in per_seed:
                for row in res.rows:
                    row["setting"] = k
            out.append(per_seed)
    return out, time.perf_counter() - t0
