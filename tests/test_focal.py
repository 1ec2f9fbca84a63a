"""F-GRPO focal weight (arXiv 2602.06717): g = (1 - X/N)^gamma per prompt group, and its TRL hook."""

import math
import types

import pytest
import torch

from engine.commands.grpo_config import method_name
from engine.grpo.focal import apply_focal, check_trl_version, focal_weights, scalar_rewards

N = 4


def grpo_advantages(rewards: torch.Tensor, n: int) -> torch.Tensor:
    """Reference GRPO advantages as TRL 1.16 computes them: (R - group mean) / (group std + 1e-4)."""
    grouped = rewards.view(-1, n)                                  # (B/N, N)
    mean = grouped.mean(dim=1).repeat_interleave(n)                # (B,)
    std = grouped.std(dim=1).repeat_interleave(n)                  # (B,) unbiased, like TRL's nanstd
    return (rewards - mean) / (std + 1e-4)


REWARDS = torch.tensor([1., 0., 0., 0.,    # group 0: X = 1
                        1., 1., 0., 0.,    # group 1: X = 2
                        1., 1., 1., 1.,    # group 2: X = 4 (all correct)
                        0., 0., 0., 0.])   # group 3: X = 0


def test_gamma_zero_reproduces_grpo_exactly():
    adv = grpo_advantages(REWARDS, N)
    w = focal_weights(REWARDS, N, gamma=0.0)
    assert torch.equal(w, torch.ones_like(REWARDS))                # 0 ** 0 = 1, also for the all-correct group
    assert torch.equal(adv * w, adv)
    assert apply_focal(adv, REWARDS, N, gamma=0.0) is adv          # the hook leaves TRL's tensor untouched


def test_all_correct_group_gets_weight_zero():
    for gamma in (0.5, 1.0, 2.0):
        w = focal_weights(REWARDS, N, gamma)
        assert torch.equal(w[8:12], torch.zeros(4))


@pytest.mark.parametrize("x, gamma, expected", [
    (1, 1.0, 0.75),              # (1 - 1/4)^1
    (2, 0.5, math.sqrt(0.5)),    # (1 - 2/4)^0.5
    (3, 2.0, 0.0625),            # (1 - 3/4)^2
    (0, 0.5, 1.0),               # nothing solved: full GRPO push
])
def test_known_success_rate_gives_known_factor(x, gamma, expected):
    rewards = torch.tensor([1.0] * x + [0.0] * (N - x))
    w = focal_weights(rewards, N, gamma)
    assert torch.allclose(w, torch.full((N,), expected)), w


def test_applied_per_prompt_group():
    gamma = 1.0
    w = focal_weights(REWARDS, N, gamma)
    expected = torch.tensor([0.75] * 4 + [0.5] * 4 + [0.0] * 4 + [1.0] * 4)
    assert torch.allclose(w, expected)
    # Permuting rollouts inside a group changes nothing; moving a correct one to another group does.
    assert torch.equal(focal_weights(REWARDS[[3, 2, 1, 0, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]], N, gamma), w)
    moved = REWARDS.clone()
    moved[0], moved[12] = 0.0, 1.0
    assert not torch.equal(focal_weights(moved, N, gamma)[:4], w[:4])
    # F-GRPO advantages = GRPO advantages x the group's weight.
    adv = grpo_advantages(REWARDS, N)
    assert torch.allclose(apply_focal(adv, REWARDS, N, gamma), adv * expected)


def test_threshold_and_unscorable_rollouts():
    rewards = torch.tensor([1.1, 0.1, float("nan"), 1.0])   # format term 0.1; NaN = reward said None
    assert torch.allclose(focal_weights(rewards, N, 1.0, correct_threshold=1.0), torch.full((4,), 0.5))


def test_process_slice():
    # Two processes with 8 rollouts each: rank 1 holds groups 2 and 3.
    adv = torch.ones(8)
    out = apply_focal(adv, REWARDS, N, gamma=1.0, process_index=1)
    assert torch.allclose(out, torch.tensor([0.0] * 4 + [1.0] * 4))


def test_bad_inputs():
    with pytest.raises(ValueError, match="multiple of num_generations"):
        focal_weights(torch.zeros(6), N, 1.0)
    with pytest.raises(ValueError, match="gamma"):
        focal_weights(torch.zeros(4), N, -0.5)


def test_scalar_rewards_matches_trl_aggregation():
    per_func = torch.tensor([[1.0, 0.5], [float("nan"), 0.5], [float("nan"), float("nan")]])
    r = scalar_rewards(per_func, torch.tensor([1.0, 2.0]))
    assert r[0] == 2.0 and r[1] == 1.0 and torch.isnan(r[2])


def test_method_name_and_version_pin():
    assert method_name(0.0) == "grpo" and method_name(0.5) == "f-grpo"
    assert check_trl_version("1.16.0") == "1.16.0"
    with pytest.raises(ValueError, match="pin trl==1.16"):
        check_trl_version("1.17.0")


def test_trainer_hook_scales_trl_output(monkeypatch):
    """FocalGRPOTrainer wraps TRL's two methods; no model: TRL's originals are stubbed."""
    trl = pytest.importorskip("trl")
    from engine.grpo.focal import focal_trainer_class

    cls = focal_trainer_class()
    adv = grpo_advantages(REWARDS, N)
    per_func = REWARDS.unsqueeze(1)                              # (B, F = 1)

    def fake_generate(self, inputs):                             # TRL: rewards first, then advantages
        self._calculate_rewards(inputs, None, None, None)
        return {"advantages": adv.clone()}

    monkeypatch.setattr(trl.GRPOTrainer, "_calculate_rewards", lambda self, *a: per_func)
    monkeypatch.setattr(trl.GRPOTrainer, "_generate_and_score_completions", fake_generate)
    trainer = cls.__new__(cls)
    trainer.num_generations, trainer.reward_weights = N, torch.ones(1)
    trainer.model = types.SimpleNamespace(training=True)
    trainer.accelerator = types.SimpleNamespace(process_index=0)
    trainer._metrics = {"train": {"focal/weight_mean": []}}
    for gamma, weights in ((0.0, torch.ones(16)), (1.0, focal_weights(REWARDS, N, 1.0))):
        trainer.focal_gamma, trainer.correct_threshold = gamma, 1.0
        out = trainer._generate_and_score_completions([])
        assert torch.equal(out["advantages"], adv * weights) if gamma else torch.equal(out["advantages"], adv)


def test_trl_still_has_the_seam():
    """The hook relies on TRL computing advantages right after _calculate_rewards, inline."""
    pytest.importorskip("trl")
    import inspect

    from trl import GRPOTrainer

    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "rewards_per_func = self._calculate_rewards(" in src
    assert '"advantages": advantages' in src


def test_focal_scaling_on_the_vllm_rollout_path(tmp_path):
    """With rollouts from ``rollout_func`` (the vllm path), TRL's advantages still get g = (1 - X/N)^gamma."""
    pytest.importorskip("trl")
    from test_grpo_rollouts import tiny_trainer

    gamma = 1.0
    trainer, backend, publisher = tiny_trainer(tmp_path, focal_gamma=gamma, max_steps=2)
    seen = []
    generate_and_score = trainer._generate_and_score_completions

    def capture(inputs):                                           # before TRL shuffles the batch
        out = generate_and_score(inputs)
        seen.append(out)
        return out

    trainer._generate_and_score_completions = capture
    trainer.train()
    publisher.close()
    assert len(seen) == 2 and len(backend.calls) == 2
    n = trainer.num_generations
    for out in seen:
        rewards = (out["completion_mask"].sum(dim=1) % 2).float()   # tests' odd_length_reward, per rollout
        w = focal_weights(rewards, n, gamma)
        assert torch.allclose(out["advantages"], grpo_advantages(rewards, n) * w, atol=1e-5)
    weights = torch.cat([focal_weights((o["completion_mask"].sum(dim=1) % 2).float(), n, gamma) for o in seen])
    assert ((weights > 0) & (weights < 1)).any()                   # a group with 0 < X < N was scaled
