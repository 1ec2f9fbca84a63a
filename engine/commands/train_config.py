"""``essa train``'s schema: the shared groups of engine/config.py plus rollout, validation and run control.

Light on purpose (no torch, no vLLM): the CLI imports it to check overrides before anything heavy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from engine.config import (ConfigError, EngineConfig, LoRAConfig, ModelConfig, RewardConfig, SFTConfig,
                           StrategyConfig, TaskConfig, check_context, check_engine, check_lora, check_reward,
                           check_sampling, check_sft, check_strategy)


@dataclass
class RolloutConfig:
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
    """

    prompts_per_generation: int = 16
    samples_per_prompt: int = 1
    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    center: bool = True
    aggregate: str = "mean"
    common_seeds: bool = True


@dataclass
class ValidationConfig:
    """The ``eval`` group of ``essa train``: held-out validation every ``every`` generations (0 = only
    at start and end) on the task's val split, greedy, ``max_tokens`` new tokens. ``baselines``: no
    adapter and the SFT adapter at step 0, and the SFT adapter again in the final call beside the
    exports (the paired test's control). Not the ``essa eval`` command (engine/commands/eval_config.py)."""

    every: int = 5
    max_tokens: int = 128
    baselines: bool = True


@dataclass
class TrainConfig:
    """``essa train``: SFT warm start, then ES over the genome (ESSA Algorithm 1).

    generations: ES generations. time_budget_s: stop after the first generation that ends past this
    many seconds of the run clock (equal-clock comparisons). deadline_s: wall-clock limit (s) of the
    whole command, warm start included: a generation starts only if it and the validations still due
    fit. resume: a run directory to continue from its checkpoint. label: the name in reports.
    report: render figures and report.md at the end.
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
    seed: int = 0
    generations: int = 10
    time_budget_s: Optional[float] = None
    deadline_s: Optional[float] = None
    resume: Optional[str] = None
    label: Optional[str] = None
    report: bool = True


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
    """Raises ConfigError on a ``rollout`` group that cannot sample a generation."""
    if r.prompts_per_generation < 1 or r.samples_per_prompt < 1 or r.max_tokens < 1:
        raise ConfigError("rollout.prompts_per_generation, rollout.samples_per_prompt and rollout.max_tokens must be >= 1")
    check_sampling("rollout", r.temperature, r.top_p)
    if r.aggregate not in ("mean", "question_z"):
        raise ConfigError(f"rollout.aggregate={r.aggregate!r}: use mean (ESSA) or question_z (per-prompt z-scores)")


def check_run_control(cfg) -> None:
    """Raises ConfigError on ``generations``, ``time_budget_s``, ``deadline_s`` or the ``eval`` group."""
    if cfg.generations < 0:
        raise ConfigError(f"generations={cfg.generations}: must be >= 0")
    if cfg.time_budget_s is not None and not cfg.time_budget_s > 0:
        raise ConfigError(f"time_budget_s={cfg.time_budget_s}: must be > 0 seconds, or null for no budget")
    if cfg.deadline_s is not None and not cfg.deadline_s > 0:
        raise ConfigError(f"deadline_s={cfg.deadline_s}: must be > 0 seconds, or null for no deadline")
    if cfg.eval.every < 0 or cfg.eval.max_tokens < 1:
        raise ConfigError(f"eval.every={cfg.eval.every} / eval.max_tokens={cfg.eval.max_tokens}: every must be >= 0 "
                          "(0 = only at the start and end), max_tokens >= 1")


def validate(cfg) -> None:
    """Cross-field checks of a composed :class:`TrainConfig`, before anything is loaded.

    Raises:
        ConfigError: one line naming the field and the fix.
    """
    check_lora(cfg.lora)
    check_strategy(cfg.strategy, cfg.lora)
    check_run_control(cfg)
    check_rollout(cfg.rollout)
    check_sft(cfg.sft)
    check_reward(cfg.reward)
    check_context("model.max_model_len", cfg.model.max_model_len,
                  {"rollout.max_tokens": cfg.rollout.max_tokens, "eval.max_tokens": cfg.eval.max_tokens})
    per_batch = cfg.strategy.population_size + int(cfg.rollout.center)  # the centre is one more adapter
    check_engine(cfg.engine, per_batch)
