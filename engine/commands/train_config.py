"""``essa train``'s schema: the shared groups of engine/config.py plus rollout, validation and run control.

Light on purpose (no torch, no vLLM): the CLI imports it to check overrides before anything heavy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from engine.config import (ConfigError, EngineConfig, LoggerConfig, LoRAConfig, ModelConfig, RewardConfig, SFTConfig,
                           SignalConfig, StrategyConfig, TaskConfig, check_context, check_engine, check_logger,
                           check_lora, check_reward, check_sampling, check_seed, check_sft, check_signal,
                           check_strategy, check_task_reward, SEED_MAX)
from engine.hardware import check_numerics, check_numerics_dtype


@dataclass
class RolloutConfig(SignalConfig):
    """Sampling of one generation (ESSA §3.3).

    prompts_per_generation: N, a fresh minibatch each generation shared by all candidates.
    samples_per_prompt: G. max_tokens: new tokens per completion. temperature: 0 = greedy.
    center: also evaluate the strategy's current mean genome as an extra, untold candidate on the
      same prompts and sampling seeds (a paired control: is the population better than its centre?).
    aggregate: rewards (P, N, G) -> fitness (P,): ``mean`` (ESSA §3.3) or ``question_z`` (each
      prompt's rewards z-scored across the population before averaging, EGGROLL arXiv 2511.16652,
      so prompts every candidate solves or fails carry no weight). Logged fitness is always the mean.
    common_seeds: at temperature > 0, every candidate (and the centre) samples a prompt with the same
      seed, so fitness differences come from the weights, not the sampling noise (common random
      numbers; ``Sampling.common_seeds``). False: (candidate, prompt) request i gets seed + i.
    fitness: ``reward`` (the rollouts' verified answers, ESSA §3.3) or ``likelihood``: no rollouts, each
      candidate's fitness is the mean log-probability per token of the minibatch's worked solutions,
      scored prefill-only in one multi-LoRA batch (``PopulationEvaluator.solution_likelihood``; a dense,
      supervised signal: the warm start's own loss, which the gradient oracle optimises; zeroth-order
      likelihood search as in EA4LLM, arXiv 2510.10603). Needs a task with worked solutions; validation
      stays greedy accuracy. The sampling fields and ``dense`` do not apply to it.
    placebo: every generation scores P copies of the strategy's mean genome instead of asking for
      candidates, and tells the strategy nothing: the numerics floor of this configuration (issue 42;
      metrics.parquet's fitness_var, pairwise_discordance and one_text_share; engine/evaluation/numerics.py).
    The fitness-signal levers (dense, dense_weight, adaptive_prompts, noise_rho,
    max_prompts_per_generation): engine/config.py ``SignalConfig``, shared with ``essa lab``.
    """

    prompts_per_generation: int = 16
    samples_per_prompt: int = 1
    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    center: bool = True
    aggregate: str = "mean"
    common_seeds: bool = True
    fitness: str = "reward"
    placebo: bool = False


@dataclass
class ValidationConfig:
    """The ``eval`` group of ``essa train``: held-out validation every ``every`` generations (0 = only
    at start and end) on the task's val split, greedy, ``max_tokens`` new tokens. ``baselines``: the
    base model at step 0 (cached) and the SFT adapter in the final call beside the exports (the paired
    test's control). ``samples`` > 0: the final call also samples ``samples`` answers per problem at
    ``sample_temperature`` for the warm start and the mean genome on the first ``sample_problems``
    held-out problems, and reports mean@n and pass@n beside greedy accuracy (ES gains show more in
    sampled metrics than in greedy accuracy: understanding-es, arXiv 2608.27351). Under ``deadline_s`` the
    periodic validations, an uncached base model score and the sampled pass yield to generations
    (engine/commands/train_schedule.py).
    Not the ``essa eval`` command (engine/commands/eval_config.py)."""

    every: int = 5
    max_tokens: int = 128
    baselines: bool = True
    samples: int = 0
    sample_temperature: float = 0.7
    sample_problems: int = 100


ROUND_SEED_STRIDE = 1000
"""Round r of ``rounds.count`` trains with ``seed + r * ROUND_SEED_STRIDE``: its own minibatches and search noise."""


@dataclass
class RoundsConfig:
    """``rounds``: train in rounds (issue 39; Iterative RandOpt's perturb-select-fold, es-levers-2.md).
    Each round runs ``generations`` generations from its warm start, then folds: the round's correct
    completions are distilled into the round's mean adapter by SFT, and that adapter (re-decomposed by the
    genome) is the next round's warm start. count: rounds (1 = plain ESSA, no fold). control: the
    rejection-sampling control (RFT without a population): every generation of a round samples P + 1
    copies of the round's warm start at ``control_temperature`` (independent seeds), the strategy is told
    nothing, and the fold distils those samples' correct completions: the same rollouts and folds without
    evolution. max_rows: at most this many distinct correct completions per fold (one per problem first).
    fold_steps: optimiser steps of a fold (null = one pass over its rows, ``sft.batch_size`` per step).
    fold_lr: its learning rate (null = ``sft.lr``).
    """

    count: int = 1
    control: bool = False
    control_temperature: float = 0.7
    max_rows: int = 256
    fold_steps: Optional[int] = None
    fold_lr: Optional[float] = None


@dataclass
class TrainConfig:
    """``essa train``: SFT warm start, then ES over the genome (ESSA Algorithm 1).

    generations: ES generations. time_budget_s: stop after the first generation that ends past this
    many seconds of the run clock (equal-clock comparisons). deadline_s: wall-clock limit (s) of the
    whole command, warm start included: a generation starts only if it and the validations still due
    fit. resume: a run directory to continue from its checkpoint. label: the name in reports.
    report: render figures and report.md at the end. oracle_genome: a (D,) .npy genome (e.g. the
    gradient oracle's, tools/genome_capacity.py) whose cosine with the strategy mean is logged per
    generation (``mean_cos_oracle``), to tell a search that moves toward a gain from a random walk.
    logger: an experiment tracker the metrics, validations, summary, figures and config also go to
    (``logger=tensorboard|mlflow|wandb``; engine/results/trackers.py).
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    eval: ValidationConfig = field(default_factory=ValidationConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0
    generations: int = 10
    time_budget_s: Optional[float] = None
    deadline_s: Optional[float] = None
    resume: Optional[str] = None
    label: Optional[str] = None
    report: bool = True
    oracle_genome: Optional[str] = None
    rounds: RoundsConfig = field(default_factory=RoundsConfig)


SCHEMA = TrainConfig
SCHEMA_NAME = "train_schema"


def register() -> None:
    """Store :class:`TrainConfig` as ``train_schema`` (the head of conf/train.yaml's defaults list), and
    a ``strategy=<name>`` option for every installed strategy plugin (engine/search/plugins.py)."""
    from hydra.core.config_store import ConfigStore

    from engine.search.plugins import register_strategy_configs

    ConfigStore.instance().store(name=SCHEMA_NAME, node=TrainConfig)
    register_strategy_configs()


def check_rollout(r) -> None:
    """Raises ConfigError on a ``rollout`` group that cannot sample a generation, or a placebo whose N would
    move (``adaptive_prompts``)."""
    if r.prompts_per_generation < 1 or r.samples_per_prompt < 1 or r.max_tokens < 1:
        raise ConfigError("rollout.prompts_per_generation, rollout.samples_per_prompt and rollout.max_tokens must be >= 1")
    check_sampling("rollout", r.temperature, r.top_p)
    if r.aggregate not in ("mean", "question_z"):
        raise ConfigError(f"rollout.aggregate={r.aggregate!r}: use mean (ESSA) or question_z (per-prompt z-scores)")
    check_signal(r, r.prompts_per_generation, "rollout.prompts_per_generation")
    if r.fitness not in ("reward", "likelihood"):
        raise ConfigError(f"rollout.fitness={r.fitness!r}: use reward (verified answers) or likelihood (the worked "
                          "solutions' log-likelihood)")
    if r.placebo and r.adaptive_prompts:  # identical copies rank as noise: N would double to the cap
        raise ConfigError(f"rollout.placebo=true with rollout.adaptive_prompts=true: identical copies never rank, so N "
                          f"would double every generation to rollout.max_prompts_per_generation="
                          f"{r.max_prompts_per_generation} (a floor measured at another N); set "
                          "rollout.adaptive_prompts=false and choose N with rollout.prompts_per_generation")
    if r.fitness == "likelihood" and r.dense != "off":
        raise ConfigError(f"rollout.dense={r.dense} scores rollouts, and rollout.fitness=likelihood makes none; "
                          "set rollout.dense=off or rollout.fitness=reward")


def check_run_control(cfg) -> None:
    """Raises ConfigError on ``generations``, ``seed``, ``time_budget_s``, ``deadline_s`` or the ``eval`` group."""
    if cfg.generations < 0:
        raise ConfigError(f"generations={cfg.generations}: must be >= 0")
    check_seed(cfg.seed)  # numpy, the strategies and the engine seed from it
    if cfg.time_budget_s is not None and not cfg.time_budget_s > 0:
        raise ConfigError(f"time_budget_s={cfg.time_budget_s}: must be > 0 seconds, or null for no budget")
    if cfg.deadline_s is not None and not 0 < cfg.deadline_s < float("inf"):
        raise ConfigError(f"deadline_s={cfg.deadline_s}: must be a finite number of seconds > 0, or null for no deadline")
    if cfg.eval.every < 0 or cfg.eval.max_tokens < 1:
        raise ConfigError(f"eval.every={cfg.eval.every} / eval.max_tokens={cfg.eval.max_tokens}: every must be >= 0 "
                          "(0 = only at the start and end), max_tokens >= 1")
    if cfg.eval.samples < 0 or cfg.eval.sample_problems < 1 or not cfg.eval.sample_temperature > 0:
        raise ConfigError(f"eval.samples={cfg.eval.samples} / eval.sample_problems={cfg.eval.sample_problems} / "
                          f"eval.sample_temperature={cfg.eval.sample_temperature}: samples >= 0 (0 = off), "
                          "sample_problems >= 1, sample_temperature > 0")


def check_rounds(cfg) -> None:
    """Raises ConfigError on a ``rounds`` group that cannot run (one line naming the field and the fix)."""
    r = cfg.rounds
    if r.count < 1 or r.max_rows < 1 or (r.fold_steps is not None and r.fold_steps < 1):
        raise ConfigError(f"rounds.count={r.count}, rounds.max_rows={r.max_rows}, rounds.fold_steps={r.fold_steps}: "
                          "each must be >= 1 (rounds.count=1: no rounds; rounds.fold_steps=null: one pass over the rows)")
    if r.fold_lr is not None and not r.fold_lr > 0:
        raise ConfigError(f"rounds.fold_lr={r.fold_lr}: must be > 0, or null for sft.lr")
    if r.count == 1:
        if r.control:
            raise ConfigError("rounds.control=true needs rounds.count >= 2 (the control is a run in rounds); "
                              "e.g. rounds.count=3 rounds.control=true")
        return
    if not r.control_temperature > 0:
        raise ConfigError(f"rounds.control_temperature={r.control_temperature}: must be > 0 (copies of one adapter "
                          "sampled greedily give one answer); e.g. rounds.control_temperature=0.7")
    for name in ("deadline_s", "time_budget_s"):
        if cfg[name] is not None:
            raise ConfigError(f"{name}={cfg[name]} with rounds.count={r.count}: budgets apply to one run, not to "
                              f"rounds; set generations (per round) instead, or {name}=null")
    if cfg.rollout.placebo:
        raise ConfigError("rollout.placebo=true with rounds.count > 1: the rounds' control is rounds.control=true; "
                          "set rollout.placebo=false")
    if cfg.rollout.fitness == "likelihood":
        raise ConfigError("rollout.fitness=likelihood with rounds.count > 1: a fold distils correct completions, and "
                          "likelihood fitness decodes none; set rollout.fitness=reward")
    if r.control and cfg.rollout.adaptive_prompts:
        raise ConfigError("rounds.control=true with rollout.adaptive_prompts=true: the control's copies never rank, so "
                          "N would double every generation; set rollout.adaptive_prompts=false")
    last = cfg.seed + (r.count - 1) * ROUND_SEED_STRIDE
    if last > SEED_MAX:
        raise ConfigError(f"seed={cfg.seed} with rounds.count={r.count}: round {r.count - 1} trains with seed "
                          f"{last} (seed + {ROUND_SEED_STRIDE} per round), above {SEED_MAX}; "
                          f"use seed <= {SEED_MAX - (r.count - 1) * ROUND_SEED_STRIDE}")
    if cfg.generations < 1:
        raise ConfigError(f"generations={cfg.generations} with rounds.count={r.count}: each round needs >= 1 "
                          "generation to fold")
    if not cfg.sft.enabled and not cfg.sft.adapter:
        raise ConfigError("rounds.count > 1 with sft.enabled=false: a fold continues the warm start's adapter "
                          "(peft's initial one has B = 0); enable the warm start")


def validate(cfg) -> None:
    """Cross-field checks of a composed :class:`TrainConfig`, before anything is loaded.

    Raises:
        ConfigError: one line naming the field and the fix.
    """
    check_lora(cfg.lora)
    check_strategy(cfg.strategy, cfg.lora)
    check_run_control(cfg)
    check_rollout(cfg.rollout)
    check_sft(cfg.sft, cfg.lora)
    check_rounds(cfg)
    check_reward(cfg.reward)
    check_task_reward(cfg.task)
    if cfg.rollout.dense != "off" and cfg.task.gym.answer_format == "answer_tag":
        raise ConfigError(f"rollout.dense={cfg.rollout.dense}: the dense reward scores the reference inside \\boxed{{}}, "
                          "which task.gym.answer_format=answer_tag (countdown) never writes; use rollout.dense=off")
    check_logger(cfg.logger)
    check_context("model.max_model_len", cfg.model.max_model_len,
                  {"rollout.max_tokens": cfg.rollout.max_tokens, "eval.max_tokens": cfg.eval.max_tokens})
    per_batch = cfg.strategy.population_size + int(cfg.rollout.center)  # the centre is one more adapter
    check_engine(cfg.engine, per_batch)
    check_numerics(cfg.engine.numerics)  # before the warm start, not when the engine starts
    if cfg.strategy.genome.kind == "tinylora" and not cfg.sft.enabled:
        raise ConfigError("strategy.genome.kind=tinylora moves the warm start's update B A, which is zero without SFT "
                          "(sft.enabled=false): enable the warm start, or use strategy.genome.kind=svd_lora "
                          "strategy.genome.mode=additive")
    if cfg.rollout.fitness == "likelihood" and cfg.engine.backend == "ray":
        raise ConfigError("rollout.fitness=likelihood runs on the local engine only (the Ray actors score rollouts); "
                          "set engine=local or rollout.fitness=reward")


def preview(cfg, choice: str | None) -> None:
    """``essa train --cfg job``'s checks (engine/cli/preview.py): :func:`validate`, ``model.dtype`` with
    ``engine.numerics`` (:func:`engine.hardware.check_numerics_dtype`), then the strategy as the run
    resolves it before the warm start (a ``strategy.name=`` over another option's options, the class, which
    imports the plugin, and its options), and the line the run logs: the strategy and the genome, with D when
    the model is on this machine already (nothing is converted or downloaded).

    Raises:
        ConfigError / ValueError: the run's own one-line refusal (e.g. a plugin whose import fails).
    """
    import logging

    from engine.model import local_model_config
    from engine.search import check_strategy_options, search_line, strategy_class
    from engine.search.plugins import check_strategy_choice

    validate(cfg)
    check_numerics_dtype(cfg.engine.numerics, cfg.model.dtype)  # the run's refusal (invariant in bf16 on a CPU)
    check_strategy_choice(cfg.strategy, cfg.seed, choice)
    cls = strategy_class(cfg.strategy)
    check_strategy_options(cls, cfg.strategy, cfg.seed)
    logging.getLogger("essa").info(search_line(cfg.strategy, cls, cfg.lora, local_model_config(cfg.model.path)))
