"""``essa eval``'s schema (conf/eval.yaml) and its checks. Light: no torch, no vLLM."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from engine.config import (ConfigError, EngineConfig, ModelConfig, RewardConfig, TaskConfig, check_sampling,
                           check_seed)
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
BASE = "no_adapter"
"""The condition of the base model without an adapter."""


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
    check_seed(cfg.seed)  # the engine, the sampled pass and the bootstrap seed from it
    if cfg.n > 1 and cfg.temperature <= 0:
        raise ConfigError(f"temperature={cfg.temperature} with n={cfg.n} gives n identical samples; "
                          f"set temperature=1.0 or n=1")
    if cfg.limit < 0:
        raise ConfigError(f"limit={cfg.limit}: must be >= 0 (0 = every problem of the split), e.g. limit=100")
    if cfg.max_tokens < 1:
        raise ConfigError(f"max_tokens={cfg.max_tokens}: must be >= 1 (new tokens per completion), e.g. max_tokens=256")
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


def preview(cfg, choice: Optional[str] = None) -> None:
    """``essa eval --cfg job``'s checks (engine/cli/preview.py): what the run refuses before it loads anything,
    :func:`validate`, the conditions (:func:`resolve_conditions`: adapter paths) and ``control``
    (:func:`resolve_control`). ``choice`` (a strategy group option) does not apply to eval.

    Raises:
        ConfigError / FileNotFoundError / ValueError: the run's own one-line refusal.
    """
    validate(cfg)
    resolve_control(cfg.control, list(resolve_conditions(cfg.adapters, cfg.include_base)))


def resolve_conditions(spec, include_base: bool = True) -> dict[str, Path | None]:
    """Condition name -> adapter directory (None = base model), in evaluation order.

    Names: ``no_adapter`` for the base model; ``mean``/``best`` (essa train) or ``final`` (essa grpo)
    for a run directory's exports (prefixed ``<run dir name>/`` when several sources are given); the
    directory name otherwise.

    Raises:
        FileNotFoundError: a path that is neither a PEFT adapter nor a run dir with adapters/.
        ConfigError: nothing to evaluate.
    """
    from engine.lora.files import adapter_specs, is_adapter_dir

    entries = adapter_specs(spec)
    conds: dict[str, Path | None] = {BASE: None} if include_base else {}

    def add(name: str, path: Path) -> None:
        base, i = name, 2
        while name in conds:
            name, i = f"{base}-{i}", i + 1
        conds[name] = path

    for entry in entries:
        p = Path(entry).expanduser()
        if is_adapter_dir(p):
            add(p.name, p.resolve())
        elif (p / "adapters").is_dir():
            found = [p / "adapters" / k for k in RUN_ADAPTERS if is_adapter_dir(p / "adapters" / k)]
            if not found:
                raise FileNotFoundError(f"adapters: run dir {p} has no adapters/mean, adapters/best (essa train) "
                                        f"or adapters/final (essa grpo) "
                                        f"(did the run finish?); pass an adapter directory instead")
            for a in found:
                add(a.name if len(entries) == 1 else f"{p.name}/{a.name}", a.resolve())
        else:
            raise FileNotFoundError(f"adapters: {p} is neither a PEFT adapter (adapter_config.json) nor a run "
                                    f"directory with adapters/; check the path")
    if not conds:
        raise ConfigError("nothing to evaluate: adapters is empty and include_base=false; "
                          "name an adapter or set include_base=true")
    return conds


def _reads_back(value: str, text: str) -> bool:
    """Whether Hydra reads the override ``key=<value>`` as the one string ``text`` (interpolations resolved)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    try:
        o = OverridesParser.create().parse_override(f"key={value}")
        return (not o.is_sweep_override() and isinstance(o.value(), str)
                and OmegaConf.create({"key": o.value()}).key == text)
    except Exception:  # noqa: BLE001 - any parse or interpolation error: it does not read back
        return False


def override_value(text: str) -> str:
    """``text`` as the value of a command-line override (``control=<value>``) that Hydra reads back as ``text``:
    as it is where it does (``run/mean``), else single-quoted with Hydra's escapes (``'a,b'``: unquoted, a
    sweep; ``'null'``: unquoted, None; ``'\\${x}'``: unquoted, an interpolation; ``'ü-ckpt'``: unquoted,
    a parse error)."""
    def quoted(t: str) -> str:
        return "'" + t.replace("'", "\\'").replace("${", "\\${") + "'"

    candidates = [text, quoted(text), quoted(text.replace("\\", "\\\\"))]
    return next((c for c in candidates if _reads_back(c, text)), candidates[1])


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
        raise ConfigError(f"control={control!r} is not an evaluated condition; available: "
                          f"{', '.join(override_value(n) for n in names)} "
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
