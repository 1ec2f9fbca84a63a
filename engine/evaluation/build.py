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


def build_evaluator(engine, model, serve_path: str, codec, meta: AdapterMeta, tokenizer, reward_fn,
                    system_prompt: str, seed: int, adapters_per_batch: int):
    """The population evaluator of ``engine.backend``.

    Args:
        engine: the ``engine`` config group. model: the ``model`` group (``max_model_len``, ``dtype``,
            and for Ray actors on other nodes ``path`` and ``quantization``).
        serve_path: the checkpoint vLLM serves (the float model or its quantized copy).
        codec: genome codec. meta: adapter metadata. tokenizer: the base model's tokenizer.
        reward_fn: ``f(completions, references) -> list[RewardResult]``. system_prompt: of every prompt.
        seed: engine seed. adapters_per_batch: adapters resident at once (P + centre + validation).

    Returns:
        :class:`~engine.evaluation.population.PopulationEvaluator` (local) or
        :class:`~engine.evaluation.ray_population.RayPopulationEvaluator` (``engine.backend=ray``).
    """
    from engine.backends.vllm_local import VLLMBackend, backend_kwargs

    kwargs = backend_kwargs(engine, max_lora_rank=meta.rank, max_loras=adapters_per_batch,
                            max_model_len=model.max_model_len, dtype=model.dtype, seed=seed)
    if engine.backend == "ray":
        from engine.evaluation.ray_population import RayPopulationEvaluator
        return RayPopulationEvaluator(engine, kwargs, serve_path, str(model.path), model.quantization, codec, meta,
                                      reward_fn, system_prompt)
    from engine.evaluation.population import PopulationEvaluator
    return PopulationEvaluator(VLLMBackend(serve_path, **kwargs), codec, reward_fn, meta, tokenizer, system_prompt,
                               engine.adapter_dir)
