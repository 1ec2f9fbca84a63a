"""F-GRPO's focal weight inside TRL's ``GRPOTrainer`` (arXiv 2602.06717), and the TRL version it is tested with.

F-GRPO: with X of a prompt group's N rollouts correct (binary reward), every advantage of that group
is multiplied by ``g = (1 - X/N) ** gamma``; ``gamma = 0`` is GRPO. How the hook sits in TRL:
engine/commands/grpo.py's module docstring.
"""
from __future__ import annotations

import functools
import time

import torch

TESTED_TRL = ("1.16.",)
"""TRL versions (prefixes) the advantage hook was tested with; others are refused."""


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
        ``vllm_rollouts`` (:class:`engine.grpo.rollouts.VLLMRollouts`, or None for TRL's own generation).
        With ``vllm_rollouts`` (and ``args.use_vllm = False``, so TRL starts no vLLM of its own) the
        rollouts come from the project's vLLM engine through ``rollout_func``, and the trainer's
        ``use_vllm`` flag is switched on after TRL's set-up: TRL then applies its importance-sampling
        correction (``args.vllm_importance_sampling_*``) to vLLM's sampled-token log-probabilities
        exactly as for its own vLLM rollouts; its per-step weight sync is a no-op
        (:class:`engine.grpo.rollouts.NoWeightSync`), the rollout function serves the step's adapter.
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
                from engine.grpo.rollouts import NoWeightSync
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
            return output if self.focal_gamma == 0 else _with_focal_advantages(self, output)

    return FocalGRPOTrainer


def _with_focal_advantages(trainer, output: dict) -> dict:
    """``output`` of TRL's ``_generate_and_score_completions`` with this process's advantages scaled by
    the focal weights of the rewards ``trainer._calculate_rewards`` kept; logs ``focal/weight_mean``."""
    mode = "train" if trainer.model.training else "eval"
    n = trainer.num_generations if mode == "train" else trainer.num_generations_eval
    rewards = scalar_rewards(trainer._focal_rewards_per_func, trainer.reward_weights)      # (B_global,)
    output["advantages"] = apply_focal(output["advantages"], rewards, n, trainer.focal_gamma,
                                       trainer.correct_threshold, trainer.accelerator.process_index)
    w = focal_weights(rewards, n, trainer.focal_gamma, trainer.correct_threshold)
    trainer._metrics[mode]["focal/weight_mean"].append(w.mean().item())
    trainer._focal_rewards_per_func = None
    return output
