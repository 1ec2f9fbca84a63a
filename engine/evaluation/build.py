"""Building a run's population evaluator from its config groups: local vLLM or Ray actors."""
from __future__ import annotations

from engine.lora.files import AdapterMeta


def math_reward(reward, cls=None, **overrides):
    """``rewards.MathReward`` (or ``cls``, e.g. ``rewards.TrlMathReward``) from a ``reward`` config group
    (``lenient``, ``timeout_s``, ``format_weight``); ``overrides`` replace fields (e.g. ``lenient=True``
    for the flexible accuracy of essa eval)."""
    from rewards import MathReward

    kwargs = {"lenient": reward.lenient, "timeout_s": reward.timeout_s, "format_weight": reward.format_weight}
    return (cls or MathReward)(**{**kwargs, **overrides})


def task_reward(task, reward, trl: bool = False, **overrides):
    """The reward function of a task: the one mapping from config to reward (train, grpo, eval, the lab).

    Args:
        task: the ``task`` group: ``task.reward`` names the verifier (``math``: ``rewards.MathReward``;
            ``reasoning_gym``: ``rewards.GymReward`` on ``task.gym.dataset`` with ``task.gym.answer_format``).
        reward: the ``reward`` group (``lenient``, ``timeout_s``, ``format_weight``).
        trl: TRL's reward-function signature (``rewards.TrlMathReward`` / ``rewards.TrlGymReward``, essa grpo).
        overrides: replace ``reward`` fields (e.g. ``lenient=True, format_weight=0.0`` for essa eval's
            flexible accuracy).

    Returns:
        ``f(completions, references) -> list[RewardResult]`` (TRL: ``f(completions, **columns) -> list[float | None]``),
        picklable.

    Raises:
        ConfigError: an unknown ``task.reward``, or ``reasoning_gym`` without ``task.gym.dataset``.
    """
    from engine.config import check_task_reward
    from rewards import GymReward, MathReward, TrlGymReward, TrlMathReward

    check_task_reward(task)
    if task.reward == "math":
        return math_reward(reward, TrlMathReward if trl else MathReward, **overrides)
    kwargs = {"lenient": reward.lenient, "timeout_s": reward.timeout_s, "format_weight": reward.format_weight}
    return (TrlGymReward if trl else GymReward)(task.gym.dataset, task.gym.answer_format, **{**kwargs, **overrides})


def build_evaluator(engine, model, serve_path: str, codec, meta: AdapterMeta, tokenizer, reward_fn,
                    system_prompt: str, seed: int, adapters_per_batch: int, dense: bool = False):
    """The population evaluator of ``engine.backend``.

    Args:
        engine: the ``engine`` config group. model: the ``model`` group (``max_model_len``, ``dtype``,
            and for Ray actors on other nodes ``path`` and ``quantization``).
        serve_path: the checkpoint vLLM serves (the float model or its quantized copy).
        codec: genome codec. meta: adapter metadata. tokenizer: the base model's tokenizer.
        reward_fn: ``f(completions, references) -> list[RewardResult]``. system_prompt: of every prompt.
        seed: engine seed. adapters_per_batch: adapters resident at once (P + centre + validation).
        dense: also score every rollout's dense reward (log p of the reference answer after the rollout's
            own reasoning; ``PopulationEvaluator.dense_scores``).

    Returns:
        :class:`~engine.evaluation.population.PopulationEvaluator` (local) or
        :class:`~engine.evaluation.ray_population.RayPopulationEvaluator` (``engine.backend=ray``).

    Raises:
        ValueError: the local evaluator's ``adapters_per_batch`` adapters fit in no directory (one line
            naming ``engine.adapter_dir``), or ``model.quantization`` is set and the LoRA self-check
            failed on its engine (one line naming ``model.quantization``; engine/evaluation/selfcheck.py).
    """
    from engine.backends.vllm_local import VLLMBackend, backend_kwargs

    kwargs = backend_kwargs(engine, max_lora_rank=meta.rank, max_loras=adapters_per_batch,
                            max_model_len=model.max_model_len, dtype=model.dtype, seed=seed)
    if engine.backend == "ray":
        from engine.evaluation.ray_population import RayPopulationEvaluator
        return RayPopulationEvaluator(engine, kwargs, serve_path, str(model.path), model.quantization, codec, meta,
                                      reward_fn, system_prompt, dense=dense)
    from engine.evaluation.population import PopulationEvaluator
    from engine.evaluation.selfcheck import selfchecked
    # the adapters' directory, checked for their space, before the engine starts (issue 29)
    evaluator = PopulationEvaluator(None, codec, reward_fn, meta, tokenizer, system_prompt, engine.adapter_dir,
                                    dense=dense, n_adapters=adapters_per_batch)
    try:
        evaluator.backend = VLLMBackend(serve_path, **kwargs)
    except BaseException:
        evaluator.close()
        raise
    return selfchecked(evaluator, model.quantization)  # LoRA on a quantized base must change the output
