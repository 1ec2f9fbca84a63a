"""``essa grpo``'s schema: the GRPO / F-GRPO settings (``grpo`` group) beside the shared groups.

Light on purpose (no torch, no TRL): the CLI imports it to check overrides before anything heavy.
The trainer and its F-GRPO hook: engine/grpo/; the run: engine/commands/grpo.py.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Optional

from engine.config import (ConfigError, LoggerConfig, LoRAConfig, ModelConfig, RewardConfig, SFTConfig, TaskConfig,
                           check_context, check_logger, check_lora, check_reward, check_sampling, check_seed, check_sft,
                           check_task_reward)
from engine.results.stats import GRPO_METHODS

log = logging.getLogger("essa.grpo")

LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo")
SCALE_REWARDS = ("group", "batch", "none")
GENERATORS = ("vllm", "transformers")
IMPORTANCE_SAMPLING = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "none")



@dataclass
class GRPOParams:
    """The ``grpo`` group: GRPO / F-GRPO settings (TRL ``GRPOConfig`` fields where named alike).

    focal_gamma: F-GRPO exponent gamma >= 0 of the focal weight (1 - X/N)^gamma; 0 = plain GRPO
      (F-GRPO uses 0.5 or 1.0).
    correct_threshold: a rollout counts as correct (towards X) when its reward >= this; the math
      reward is 1 (+ format term) when correct, 0 (+ format term) when not.
    num_generations: N, rollouts per prompt (>= 2).
    prompts_per_step: distinct prompts per optimiser step; a step trains on
      prompts_per_step x num_generations rollouts.
    micro_batch_size: rollouts per forward/backward pass (gradient accumulation inside one step);
      null = :func:`auto_micro_batch` (at most 16). Must divide prompts_per_step x num_generations.
      Memory grows with it: one pass over 64 rollouts of SmolLM2-135M took about 19 GB on CPU.
    steps_per_generation: optimiser steps trained on one generation batch (k >= 1): the rollouts of k
      steps (k x prompts_per_step x num_generations) are generated in one call, then each step trains
      on its own slice, each rollout once. TRL's ``steps_per_generation`` counts micro-batches; this one
      counts optimiser steps (TRL's = k x gradient-accumulation steps). k > 1 makes steps 2..k of a
      batch off-policy by up to k - 1 updates; TRL's clipped ratio against the log-probabilities
      computed when the batch was generated (``old_per_token_logps``) accounts for it, as in PPO's
      rollout-batch / mini-batch split (Schulman et al. 2017, arXiv 1707.06347, §5; verl's
      ``ppo_mini_batch_size``). Larger k gives the generator a larger batch (vLLM's throughput grows
      with it; a transformers ``generate`` on CPU barely does). A batch needs k x prompts_per_step
      training problems (:func:`check_generation_batch`); a run that stops inside a batch (max_steps not
      a multiple of k, or time_budget_s) leaves the batch's remaining rollouts unused.
    learning_rate: AdamW learning rate, constant (LoRA: 1e-5 .. 1e-4).
    max_steps: optimiser steps (upper bound when time_budget_s is set).
    max_completion_length: new tokens per rollout. temperature/top_p: rollout sampling.
    beta: KL coefficient against the warm-start adapter (0 = no KL term, no reference pass).
    loss_type: TRL loss aggregation (grpo | dapo | dr_grpo | bnpo; dapo = token mean, TRL's default).
    scale_rewards: advantage scaling (group = GRPO's std of the group | batch | none).
    eval_every: held-out validation every this many steps (0 = only at start and end).
    eval_max_tokens: new tokens per greedy validation answer. eval_batch_size: problems per
      validation ``generate`` call (transformers path; the vllm path validates in one batch).
    time_budget_s: stop after the first step that ends past this many wall-clock seconds of the
      run (equal-time comparisons); null = no budget.
    generator: who generates the rollouts: ``vllm`` (the project's vLLM back-end through TRL's
      ``rollout_func``, CPU and GPU; validation through the same engine, as in ``essa train``) or
      ``transformers`` (TRL's own transformers ``generate``; validation with transformers).
    importance_sampling: TRL's correction for the sampler/trainer mismatch on the vllm path
      (``vllm_importance_sampling_mode``: token_truncate | token_mask | sequence_truncate |
      sequence_mask, or none = off); ignored by the transformers path, whose sampler is the trainer.
    importance_sampling_cap: C_max of that correction (ratios clipped or masked above it).
    vllm_gpu_memory_utilization: GPU fraction for the vLLM engine (GPU only; shares the GPU with training).
    gradient_checkpointing: trade compute for activation memory (TRL defaults to true; off here).
    """

    focal_gamma: float = 0.0
    correct_threshold: float = 1.0
    num_generations: int = 8
    prompts_per_step: int = 8
    micro_batch_size: Optional[int] = None
    steps_per_generation: int = 1
    learning_rate: float = 5e-5
    max_steps: int = 100
    max_completion_length: int = 96
    temperature: float = 1.0
    top_p: float = 1.0
    beta: float = 0.0
    loss_type: str = "dapo"
    scale_rewards: str = "group"
    eval_every: int = 5
    eval_max_tokens: int = 96
    eval_batch_size: int = 32
    time_budget_s: Optional[float] = None
    generator: str = "vllm"
    importance_sampling: str = "token_truncate"
    importance_sampling_cap: float = 2.0
    vllm_gpu_memory_utilization: float = 0.3
    gradient_checkpointing: bool = False


@dataclass
class GRPORunConfig:
    """``essa grpo``: SFT warm start (shared with ``essa train``), then GRPO / F-GRPO with TRL."""

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    grpo: GRPOParams = field(default_factory=GRPOParams)
    logger: LoggerConfig = field(default_factory=LoggerConfig)  # experiment tracker (engine/results/trackers.py)
    seed: int = 0
    label: Optional[str] = None


SCHEMA = GRPORunConfig


def register() -> None:
    """Store the schema as ``grpo_schema`` in Hydra's ConfigStore (``conf/grpo.yaml`` extends it)."""
    from hydra.core.config_store import ConfigStore
    ConfigStore.instance().store(name="grpo_schema", node=GRPORunConfig)


MAX_AUTO_MICRO_BATCH = 16


def check_generation_batch(g: GRPOParams, n_train: int) -> None:
    """Refuse a generation batch larger than the training set; warn when ``max_steps`` leaves rollouts unused.

    TRL samples ``prompts_per_step x steps_per_generation`` distinct prompts per generation batch and
    drops an incomplete batch, so a batch larger than the training set trains nothing.

    Raises:
        ConfigError: ``prompts_per_step x steps_per_generation > n_train`` (one line with the fix).
    """
    need = g.prompts_per_step * g.steps_per_generation
    if need > n_train:
        raise ConfigError(f"grpo.steps_per_generation={g.steps_per_generation}: a generation batch takes prompts_per_step "
                          f"x steps_per_generation = {need} distinct prompts, but the task has {n_train} training "
                          "problems; lower grpo.steps_per_generation or grpo.prompts_per_step, or raise task.train_size")
    if g.max_steps % g.steps_per_generation:
        log.warning("grpo.max_steps=%d is not a multiple of grpo.steps_per_generation=%d: the last generation batch "
                    "generates rollouts for %d steps and trains %d", g.max_steps, g.steps_per_generation,
                    g.steps_per_generation, g.max_steps % g.steps_per_generation)


def auto_micro_batch(rollouts: int, cap: int = MAX_AUTO_MICRO_BATCH) -> int:
    """Rollouts per forward/backward pass when ``grpo.micro_batch_size`` is null: the largest divisor
    of ``rollouts`` (prompts_per_step x num_generations) that is at most ``cap``.

    Bounds the training step's memory (logits are micro x tokens x vocabulary floats): measured on
    CPU with SmolLM2-135M, one pass over 64 rollouts of 96 new tokens needed about 19 GB and was
    killed for memory on a 24 GB machine. Gradient accumulation keeps the optimiser step the same.
    """
    return max(d for d in range(1, min(rollouts, cap) + 1) if rollouts % d == 0)


def check_batches(g) -> None:
    """Raises ConfigError on the ``grpo`` group's batch shape: N rollouts per prompt, prompts per step,
    micro-batches, optimiser steps per generation batch."""
    if g.num_generations < 2:
        raise ConfigError(f"grpo.num_generations={g.num_generations}: GRPO needs >= 2 rollouts per prompt, e.g. 4")
    if g.prompts_per_step < 1:
        raise ConfigError(f"grpo.prompts_per_step={g.prompts_per_step}: must be >= 1")
    rollouts = g.prompts_per_step * g.num_generations
    if g.micro_batch_size is not None and (g.micro_batch_size < 1 or rollouts % g.micro_batch_size):
        raise ConfigError(f"grpo.micro_batch_size={g.micro_batch_size}: must divide prompts_per_step x "
                          f"num_generations = {rollouts}; or set grpo.micro_batch_size=null")
    if g.steps_per_generation < 1:
        raise ConfigError(f"grpo.steps_per_generation={g.steps_per_generation}: must be >= 1 (optimiser steps per "
                          "generation batch; 1 = on-policy)")



def check_focal(g, reward) -> None:
    """Raises ConfigError unless gamma >= 0 and ``grpo.correct_threshold`` separates correct from wrong
    rollouts under ``reward.format_weight``."""
    if not g.focal_gamma >= 0:
        raise ConfigError(f"grpo.focal_gamma={g.focal_gamma}: must be >= 0 (0 = GRPO; F-GRPO uses 0.5 or 1.0)")
    # the math reward is 1 (correct) or 0 (wrong), plus format_weight or 0: a wrong rollout scores at
    # most max(0, fw), a correct one at least 1 + min(0, fw); the threshold must lie between them, or
    # wrong rollouts count as correct (or correct ones as wrong) and F-GRPO's focal weight misleads
    fw = reward.format_weight
    lo, hi = max(0.0, fw), 1.0 + min(0.0, fw)
    if not lo < hi:
        raise ConfigError(f"reward.format_weight={fw:g}: |format_weight| must be < 1, or a wrong boxed answer scores "
                          "as much as a correct unboxed one; e.g. reward.format_weight=0.1")
    if not lo < g.correct_threshold <= hi:
        raise ConfigError(f"grpo.correct_threshold={g.correct_threshold}: must be > {lo:g} and <= {hi:g} (a wrong "
                          f"rollout scores at most {lo:g}, a correct one at least {hi:g} with reward.format_weight="
                          f"{fw:g}), else wrong rollouts count as correct or correct ones as wrong; "
                          f"e.g. grpo.correct_threshold={hi:g}")


def check_training(g) -> None:
    """Raises ConfigError on the ``grpo`` group's optimisation, budget, validation and TRL settings."""
    if g.max_steps < 1:
        raise ConfigError(f"grpo.max_steps={g.max_steps}: must be >= 1")
    if not g.learning_rate > 0:
        raise ConfigError(f"grpo.learning_rate={g.learning_rate}: must be > 0, e.g. 5e-5")
    if g.max_completion_length < 1 or g.eval_max_tokens < 1 or g.eval_batch_size < 1:
        raise ConfigError("grpo.max_completion_length, grpo.eval_max_tokens and grpo.eval_batch_size must be >= 1")
    if g.eval_every < 0:
        raise ConfigError(f"grpo.eval_every={g.eval_every}: must be >= 0 (0 = only at start and end)")
    if g.time_budget_s is not None and not g.time_budget_s > 0:
        raise ConfigError(f"grpo.time_budget_s={g.time_budget_s}: must be > 0 seconds, or null for no budget")
    if not (math.isfinite(g.beta) and g.beta >= 0):
        raise ConfigError(f"grpo.beta={g.beta}: must be a finite number >= 0 (0 = no KL term)")
    if not 0 < g.vllm_gpu_memory_utilization <= 1:
        raise ConfigError(f"grpo.vllm_gpu_memory_utilization={g.vllm_gpu_memory_utilization}: must be in (0, 1] "
                          f"(the engine's fraction of GPU memory), e.g. grpo.vllm_gpu_memory_utilization=0.3")
    if g.loss_type not in LOSS_TYPES:
        raise ConfigError(f"grpo.loss_type={g.loss_type!r}: use one of {', '.join(LOSS_TYPES)}")
    if g.scale_rewards not in SCALE_REWARDS:
        raise ConfigError(f"grpo.scale_rewards={g.scale_rewards!r}: use one of {', '.join(SCALE_REWARDS)}")
    if g.generator not in GENERATORS:
        raise ConfigError(f"grpo.generator={g.generator!r}: use one of {', '.join(GENERATORS)}")
    if g.importance_sampling not in IMPORTANCE_SAMPLING:
        raise ConfigError(f"grpo.importance_sampling={g.importance_sampling!r}: use one of "
                          f"{', '.join(IMPORTANCE_SAMPLING)}")
    if not g.importance_sampling_cap > 1:
        raise ConfigError(f"grpo.importance_sampling_cap={g.importance_sampling_cap}: must be > 1, e.g. 2.0")


def check_importance_sampling(g) -> None:
    """Refuse top-p sampling together with TRL's importance-sampling correction on the vllm generator.

    TRL divides the trainer's log-probability of each rollout token (the full softmax at the rollout
    temperature) by the sampler's, but vLLM's comes from the top-p-truncated, renormalised
    distribution, so the ratio is biased low wherever top-p cut the tail (TRL issues 4159 and 6789):
    at ``grpo.temperature=0.7`` the mean ratio at step 0, where the policies are the same, was about
    1.00 with top_p=1 and 0.96 with top_p=0.9, and the truncation/masking acts on that bias.

    Raises:
        ConfigError: ``grpo.top_p < 1`` and ``grpo.importance_sampling`` not ``none`` with
            ``grpo.generator=vllm`` (one line naming both fields and the alternatives).
    """
    if g.generator == "vllm" and g.top_p < 1 and g.importance_sampling != "none":
        raise ConfigError(f"grpo.top_p={g.top_p:g} with grpo.importance_sampling={g.importance_sampling}: the correction "
                          "divides by top-p-truncated sampler probabilities and is biased (TRL issues 4159, 6789); use "
                          "grpo.top_p=1.0, or grpo.importance_sampling=none, or grpo.generator=transformers")


def validate(cfg) -> None:
    """Cross-field checks of a composed :class:`GRPORunConfig`.

    Raises:
        ConfigError: one line naming the field and the fix.
    """
    g = cfg.grpo
    check_seed(cfg.seed)
    check_batches(g)
    check_focal(g, cfg.reward)
    check_training(g)
    check_lora(cfg.lora)
    check_sampling("grpo", g.temperature, g.top_p)
    check_importance_sampling(g)
    if g.temperature == 0:
        raise ConfigError("grpo.temperature=0: greedy decoding makes the N rollouts of a prompt identical, so every "
                          "advantage is 0 and nothing trains; use grpo.temperature > 0, e.g. 1.0")
    check_context("model.max_model_len", cfg.model.max_model_len,
                  {"grpo.max_completion_length": g.max_completion_length, "grpo.eval_max_tokens": g.eval_max_tokens})
    check_reward(cfg.reward)
    check_task_reward(cfg.task)
    check_logger(cfg.logger)
    check_sft(cfg.sft, cfg.lora)


def method_name(focal_gamma: float) -> str:
    """``grpo`` for gamma = 0, else ``f-grpo`` (run.json and validation rows; :data:`GRPO_METHODS`)."""
    grpo, f_grpo = GRPO_METHODS
    return grpo if focal_gamma == 0 else f_grpo


