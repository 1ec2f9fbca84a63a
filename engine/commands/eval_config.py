"""``essa eval``'s schema (conf/eval.yaml) and its checks. Light: no torch, no vLLM."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from engine.config import ConfigError, EngineConfig, ModelConfig, RewardConfig, TaskConfig, check_sampling
from engine.hardware import check_numerics_dtype
from engine.results.passk import check_ks, default_ks


@dataclass
class DriftConfig:
    """Off-task drift (``essa eval drift.enabled=true``; engine/evaluation/drift.py): KL(reference || each
    condition), the reference's own continuations rescored prefill-only by every condition.

    enabled: measure it. sets: prompt sets, task names of conf/task/ (their held-out prompts): the eval's
      own task for on-task KL, other math sets (``svamp``, ``gsm8k``...) as near-task, procedural tasks
      as off-task. prompts: prompts per set (the first ones of the set's held-out split). max_tokens: the
      continuation cap (tokens). references: ``warm_start`` (the SFT adapter a run directory among
      ``adapters`` names in its run.json), ``base`` (the model without an adapter) or an adapter
      directory. seed: sampling seed of the reference's continuations (cached per reference, set,
      prompts, cap and seed under $ESSA_CACHE/drift).
    """

    enabled: bool = False
    sets: List[str] = field(default_factory=lambda: ["svamp"])
    prompts: int = 200
    max_tokens: int = 128
    references: List[str] = field(default_factory=lambda: ["warm_start", "base"])
    seed: int = 0


@dataclass
class EvalConfig:
    """``essa eval`` (conf/eval.yaml).

    adapters: adapter directories and/or run directories (a run dir gives ``adapters/mean`` and
      ``adapters/best``); a single path, a list, or ``none``/``null``/``[]`` for the base model only.
    include_base: also evaluate the base model without an adapter (condition ``no_adapter``).
    split: ``val`` (the task's held-out rows, ``task.val_size`` of them) or ``train``.
    limit: at most this many problems of the split (0 = all).
    n: samples per problem at ``temperature`` (1 = greedy only; F-GRPO uses 256).
    temperature, top_p: decoding of the sampled pass (the greedy pass always uses temperature 0).
    ks: pass@k for these k, each in [1, n]; null = 1, 2, 4, ... up to n, plus n.
    max_tokens: new tokens per completion.
    seed: sampling seed. Common random numbers across conditions: in the sampled pass the request of
      (condition, problem) gets seed + crc32(prompt) (the k-th repeat of a prompt text within one
      condition crc32(text, k); ``Sampling.common_seeds``), and vLLM gives sample g of a seeded request
      the seed + g (vllm/v1/engine/parallel_sampling.py), so sample g of problem i is drawn with the same
      random numbers under every condition; also the bootstrap's seed.
    control: the condition every other one is compared with (pass@k differences with paired bootstrap
      intervals); null = the first adapter condition (list the warm start first), or ``no_adapter``
      when only the base model is evaluated.
    lora_rank: the engine's max_lora_rank; null = the largest rank among the adapters (``r`` and
      ``rank_pattern`` of their adapter_config.json, :func:`adapter_rank`).
    output_dir: where results go; null = Hydra's run directory.
    save_completions: also write ``eval_samples.parquet`` (one row per completion; large for big n).
    label: name shown in reports; null = model and task.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    adapters: Any = field(default_factory=list)
    include_base: bool = True
    split: str = "val"
    limit: int = 0
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    ks: Optional[List[int]] = None
    max_tokens: int = 256
    seed: int = 0
    control: Optional[str] = None
    lora_rank: Optional[int] = None
    output_dir: Optional[str] = None
    save_completions: bool = False
    label: Optional[str] = None
    drift: DriftConfig = field(default_factory=DriftConfig)


# The adapters a run directory exports: essa train (mean genome, best candidate), essa grpo (final policy).
RUN_ADAPTERS = ("mean", "best", "final")


SCHEMA = EvalConfig


def register() -> None:
    """Register ``eval_schema`` (the defaults-list head of conf/eval.yaml) with Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="eval_schema", node=EvalConfig)


def validate(cfg) -> list[int]:
    """Cross-field checks of an EvalConfig; returns the pass@k list (empty when n == 1).

    Raises:
        ConfigError: one line naming the field and the fix.
    """
    if cfg.split not in ("val", "train"):
        raise ConfigError(f"split={cfg.split!r}: use val or train")
    if cfg.n < 1:
        raise ConfigError(f"n={cfg.n}: need at least one sample per problem (1 = greedy only)")
    check_sampling("", cfg.temperature, cfg.top_p)
    if cfg.n > 1 and cfg.temperature <= 0:
        raise ConfigError(f"temperature={cfg.temperature} with n={cfg.n} gives n identical samples; "
                          f"set temperature=1.0 or n=1")
    if cfg.limit < 0 or cfg.max_tokens < 1:
        raise ConfigError("limit must be >= 0 and max_tokens >= 1")
    if cfg.engine.backend != "local":
        raise ConfigError(f"engine.backend={cfg.engine.backend!r}: essa eval runs one local vLLM engine; "
                          f"use engine=local")
    check_numerics_dtype(cfg.engine.numerics, cfg.model.dtype)  # invariant in bf16 on a CPU: refused as the run does
    check_drift(cfg.drift)
    if cfg.n == 1:
        if cfg.ks:
            raise ConfigError(f"ks={list(cfg.ks)} with n=1: n=1 is greedy decoding only, pass@k needs sampling; "
                              f"drop ks, or sample with n >= 2 (e.g. n={max(max(cfg.ks), 2)} ks={list(cfg.ks)})")
        return []
    try:
        return check_ks(list(cfg.ks), cfg.n) if cfg.ks else default_ks(cfg.n)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def resolve_control(control: Optional[str], names: List[str]) -> str:
    """The control condition of the pass@k comparisons (``control`` of EvalConfig).

    Args:
        control: the configured name, or None for the default.
        names: the evaluated conditions in order (``no_adapter`` first when the base model is included).

    Returns:
        ``control`` when it names a condition; for None the first adapter condition (the first name other
        than ``no_adapter``), else the first name.

    Raises:
        ConfigError: ``control`` names no condition; one line listing the available names.
    """
    if control is None:
        return next((n for n in names if n != "no_adapter"), names[0])
    if control not in names:
        raise ConfigError(f"control={control!r} is not an evaluated condition; available: {', '.join(names)} "
                          f"(set control= to one of them, or control=null for the first adapter)")
    return control


def check_drift(d) -> None:
    """Raises ConfigError on a ``drift`` group that cannot measure anything."""
    if not d.enabled:
        return
    if d.prompts < 1 or d.max_tokens < 1:
        raise ConfigError(f"drift.prompts={d.prompts} / drift.max_tokens={d.max_tokens}: both must be >= 1, "
                          "e.g. drift.prompts=200 drift.max_tokens=128")
    if not list(d.sets):
        raise ConfigError("drift.sets is empty: name prompt sets (task names of conf/task/), e.g. drift.sets=[svamp]")
    if not list(d.references):
        raise ConfigError("drift.references is empty: name the reference(s), e.g. drift.references=[warm_start,base]")
