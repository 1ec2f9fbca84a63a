"""Held-out accuracy of a GRPO policy during training: on the run's vLLM engine (as ``essa train``
validates) or with transformers ``generate`` (the ``grpo.generator=transformers`` path)."""
from __future__ import annotations

import numpy as np
import torch

from engine.prompts import chat_messages


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


def transformers_accuracy_fn(tokenizer, problems, system_prompt: str, max_tokens: int, batch_size: int, reward_fn):
    """``accuracy(step, model, final)`` of the transformers path: :func:`greedy_accuracy` of the trained
    model, ``{"policy": (n,) rewards}``. ``final`` changes nothing here: transformers' greedy decoding
    repeats exactly for the same batches, so the step-0 ``sft`` rows stay the paired control."""

    def accuracy(step: int, model, final: bool = False) -> dict[str, np.ndarray]:
        return {"policy": greedy_accuracy(model, tokenizer, problems, system_prompt, max_tokens, batch_size, reward_fn)}
    return accuracy


def vllm_accuracy_fn(evaluator, publisher, unwrap, problems, max_tokens: int, seed: int, sft_ref=None):
    """``accuracy(step, model, final)`` of the vllm path: the code and engine of ES validation.

    The policy's adapter after ``step`` steps is published (:class:`engine.grpo.rollouts.AdapterPublisher`;
    the next step's rollouts reuse it) and scored by ``engine.evaluation.validation.held_out_rewards`` through
    ``PopulationEvaluator.score``: greedy, ``max_tokens`` new tokens, ``rewards.MathReward``; the
    accuracy is the mean per-problem reward with unscorable answers counted wrong, as in ``essa train``.
    With ``final`` the SFT adapter (``sft_ref``) is scored again in the same engine call, as essa train's
    final validation does: bf16 greedy decoding drifts between calls, so the paired test's control must
    come from the same call as the policy.

    Args:
        evaluator: ``engine.evaluation.population.PopulationEvaluator`` on the run's vLLM back-end.
        publisher: the rollouts' adapter publisher. unwrap: model -> the peft model (accelerate's unwrap).
        problems: held-out problems. max_tokens: new tokens per answer. seed: run seed.
        sft_ref: ``AdapterRef`` of the SFT warm start (None: the final call scores the policy only).

    Returns:
        ``accuracy(step, model, final=False) -> {"policy": (n,) float64 rewards[, "sft": (n,)]}``.
    """
    from engine.evaluation.validation import held_out_rewards

    def accuracy(step: int, model, final: bool = False) -> dict[str, np.ndarray]:
        conds = {"policy": publisher.publish(unwrap(model), step)}
        if final and sft_ref is not None:
            conds["sft"] = sft_ref
        per_problem = held_out_rewards(evaluator, conds, problems, max_tokens, seed)  # condition -> (n,)
        return {c: np.nan_to_num(np.asarray(r, dtype=float)) for c, r in per_problem.items()}  # NaN = wrong
    return accuracy
