"""``essa bench``'s schema (conf/bench.yaml) and its checks. Light: no torch, no vLLM."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from engine.config import EngineConfig, LoRAConfig, ModelConfig, check_seed
from engine.hardware import check_numerics_dtype


@dataclass
class NaiveConfig:
    """The naive baseline: transformers + peft, one candidate at a time (``enabled``); ``candidates`` of
    them are timed and the per-candidate mean is scaled to P."""

    enabled: bool = True
    candidates: int = 1


@dataclass
class PlaceboConfig:
    """The numerics floor (engine/evaluation/numerics.py): ``enabled`` scores ``phases_population`` identical
    copies of one adapter as one generation on the bench's prompts, and ``alone`` of those requests alone
    (a batch of one) against their text in the full batch (0 = no alone probe)."""

    enabled: bool = True
    alone: int = 4


@dataclass
class BenchConfig:
    """``essa bench``: population evaluation against plain inference and the naive loop (engine/commands/bench.py).

    data: GSM8K-format JSONL of the prompts (relative: cwd, the repo, then $ESSA_DATA).
    system_prompt: of every prompt. populations: the P values, each one ES generation's generate call.
    prompts_per_candidate: B, the prompts every candidate sees. max_tokens: new tokens per completion
    (greedy). phases_population: the P at which every phase of one ES generation is reported.
    repeats: > 1 repeats each (base, population) pair and reports the best of each.
    base_without_lora: also time the base model on an engine without LoRA support (the strict limit).
    sigma0: CMA-ES step size over the SVD-LoRA genome (as strategy=essa). placebo: the numerics floor
    (:class:`PlaceboConfig`). output: the JSON path
    (null = <run dir>/bench.json).
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    data: str = "gsm8k/test.jsonl"
    system_prompt: str = "Solve the math problem step by step. Put the final answer in \\boxed{}."
    populations: List[Any] = field(default_factory=lambda: [4, 16, 48])
    prompts_per_candidate: Any = 16
    max_tokens: Any = 96
    phases_population: Any = 16
    repeats: int = 1
    base_without_lora: bool = False
    seed: int = 0
    sigma0: float = 0.1
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    naive: NaiveConfig = field(default_factory=NaiveConfig)
    placebo: PlaceboConfig = field(default_factory=PlaceboConfig)
    output: Optional[str] = None


SCHEMA = BenchConfig


def register() -> None:
    """Store the schema as ``bench_schema`` (the head of conf/bench.yaml's defaults list)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="bench_schema", node=BenchConfig)


def _positive_int(value: Any) -> int | None:
    """``value`` as an int when it is a positive integer (not a bool, float or string), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def validate(cfg) -> tuple[list[int], int, int, int]:
    """The checked sizes of ``cfg``: (sorted populations with phases_population, B, T, phases_population).

    Raises:
        ValueError: ``populations`` is not a non-empty list of positive integers, or
            ``prompts_per_candidate``, ``max_tokens`` or ``phases_population`` is not a positive integer.
    """
    from omegaconf import OmegaConf

    raw = cfg.populations
    if OmegaConf.is_config(raw):
        raw = OmegaConf.to_container(raw, resolve=True)
    if not isinstance(raw, (list, tuple)) or not raw or any(_positive_int(p) is None for p in raw):
        raise ValueError(f"bench.populations={raw!r}: must be a non-empty list of positive integers "
                         f"(population sizes), e.g. populations=[4,16,48]")
    sizes = {}
    for name in ("prompts_per_candidate", "max_tokens", "phases_population"):
        sizes[name] = _positive_int(cfg[name])
        if sizes[name] is None:
            raise ValueError(f"bench.{name}={cfg[name]!r}: must be a positive integer, e.g. {name}=16")
    alone = cfg.get("placebo", {}).get("alone", 0)
    if not isinstance(alone, int) or isinstance(alone, bool) or alone < 0:
        raise ValueError(f"bench.placebo.alone={alone!r}: must be an integer >= 0 (requests probed alone), "
                         "e.g. placebo.alone=4")
    if cfg.get("placebo", {}).get("enabled", False) and sizes["phases_population"] < 2:
        raise ValueError(f"bench.phases_population={sizes['phases_population']} with placebo.enabled=true: the placebo "
                         "compares identical copies and needs at least 2, e.g. phases_population=16, or "
                         "placebo.enabled=false")
    check_numerics_dtype(cfg.get("engine", {}).get("numerics", "auto"), cfg.get("model", {}).get("dtype", "auto"))
    check_seed(cfg.get("seed", 0))  # the engine seeds numpy with it
    populations = sorted({*raw, sizes["phases_population"]})
    return populations, sizes["prompts_per_candidate"], sizes["max_tokens"], sizes["phases_population"]
