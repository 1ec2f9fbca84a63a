"""The drift part of ``essa eval`` (``drift.enabled=true``): KL(reference || condition) on prompt sets.

For each reference (``drift.references``: the warm start, the base model, or an adapter) and each
prompt set (``drift.sets``: task names of conf/task/), the reference samples one continuation per prompt
once (cached under ``$ESSA_CACHE/drift``), and every condition of the eval rescores those tokens in one
prefill batch beside the reference (engine/evaluation/drift.py). Outputs in the eval's directory:
``eval_drift.json`` (per reference, set and condition: ``kl_prompt``, ``kl_token``, their bootstrap 95 %
intervals, prompts, tokens) and ``eval_drift_prompts.parquet`` (one row per reference, set, condition
and prompt: mean log-ratio and tokens).
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from engine import io
from engine.backends import AdapterRef, lora_int_id
from engine.config import CONF_DIR, ConfigError

log = logging.getLogger("essa.eval")

BASE = "base"
WARM_START = "warm_start"


def drift_task(name: str):
    """The ``task`` group of conf/task/<name>.yaml (engine/config.py ``TaskConfig``).

    Raises:
        ConfigError: no such task (one line naming drift.sets and the choices).
    """
    from omegaconf import OmegaConf

    from engine.config import TaskConfig

    path = CONF_DIR / "task" / f"{name}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in (CONF_DIR / "task").glob("*.yaml"))
        raise ConfigError(f"drift.sets: no task {name!r}; use task names of conf/task/: {', '.join(names)}")
    return OmegaConf.merge(OmegaConf.structured(TaskConfig), OmegaConf.load(path))


def reference_adapters(references, adapters_spec) -> dict[str, Path | None]:
    """``drift.references`` -> {name: adapter dir or None (the base model)}.

    ``warm_start`` is the SFT adapter the first run directory among ``adapters`` names (run.json
    ``sft_adapter``); an adapter directory stands for itself.

    Raises:
        ConfigError / FileNotFoundError: ``warm_start`` without a run directory that names one, or a
            path that is not a PEFT adapter (one line naming drift.references).
    """
    from engine.lora.files import is_adapter_dir, adapter_specs

    out: dict[str, Path | None] = {}
    for ref in references:
        if ref == BASE:
            out[BASE] = None
        elif ref == WARM_START:
            out[WARM_START] = _warm_start_of(adapter_specs(adapters_spec))
        elif is_adapter_dir(Path(ref)):
            out[Path(ref).name] = Path(ref).resolve()
        else:
            raise FileNotFoundError(f"drift.references: {ref!r} is neither base, warm_start nor a PEFT adapter "
                                    "directory; fix the path")
    return out


def _warm_start_of(entries: list[str]) -> Path:
    for entry in entries:
        run_json = Path(entry) / "run.json"
        if run_json.is_file():
            sft = io.read_json(run_json).get("sft_adapter")
            if sft and (Path(sft) / "adapter_config.json").is_file():
                return Path(sft).resolve()
    raise ConfigError("drift.references=warm_start needs a run directory (essa train / grpo) among adapters whose "
                      "run.json names its SFT adapter; pass the warm start's adapter directory in drift.references")


def set_prompts(name: str, n: int, tokenizer) -> tuple[list[str], list[list[int]]]:
    """The first ``n`` held-out prompts of task ``name``, chat-templated: (texts, token ids).

    Raises:
        ValueError: the set has no problem (one line naming drift.sets).
    """
    from engine.prompts import build_prompt
    from engine.tasks import load_task

    cfg = drift_task(name)
    problems = load_task(cfg).val[:n]
    if not problems:
        raise ValueError(f"drift.sets: task {name!r} has no held-out problems; check its path and val_size")
    texts = [build_prompt(tokenizer, p.question, cfg.system_prompt) for p in problems]
    return texts, [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def continuations(backend, ref_name: str, ref_path: Path | None, set_name: str, cfg, tokenizer, model_path):
    """The reference's continuations on one set, from the drift cache or sampled now (and cached).

    The cache key holds what decides them: the model (its path: a quantized copy has its own), the
    engine's dtype (bf16 and float32 sample other tokens), the reference adapter's bytes, the prompts and
    every sampling setting (:func:`engine.evaluation.drift.reference_sampling`)."""
    import dataclasses

    from engine.evaluation.drift import Continuations, reference_sampling, sample_continuations
    from engine.evaluation.validation import adapter_digest, cached_json
    from engine.model import cache_dir

    texts, ids = set_prompts(set_name, cfg.drift.prompts, tokenizer)
    ref = None if ref_path is None else AdapterRef(f"drift-{ref_name}", lora_int_id(-1, 900), str(ref_path))
    key = {"model": model_path, "dtype": str(backend.dtype), "reference": adapter_digest(ref_path),
           "set": set_name, "prompts": ids,
           "sampling": dataclasses.asdict(reference_sampling(cfg.drift.max_tokens, cfg.drift.seed))}

    def sample() -> dict:
        s = sample_continuations(backend, ids, texts, ref, cfg.drift.max_tokens, cfg.drift.seed)
        return {"prompts": s.prompts, "tokens": s.tokens}

    got, hit = cached_json(cache_dir() / "drift", key, sample)
    log.info("drift: %s continuations on %s (%d prompts)%s", ref_name, set_name, len(got["prompts"]),
             " from the cache" if hit else "")
    return ref, Continuations(got["prompts"], got["tokens"])


def run_drift(cfg, backend, conds: dict[str, Path | None], refs: dict[str, Path | None], tokenizer,
              model_path: str, out_dir: Path) -> dict:
    """KL(reference || condition) for every reference (``refs``, :func:`reference_adapters`), set and
    condition; writes the outputs.

    Returns:
        ``{reference: {set: {condition: kl_estimate dict}}}`` (also eval_drift.json).
    """
    from engine.evaluation.drift import kl_estimate, log_ratios

    adapters = {n: None if p is None else AdapterRef(f"eval-{i}", lora_int_id(-1, i), str(p))
                for i, (n, p) in enumerate(conds.items())}
    result, rows = {}, []
    for ref_name, ref_path in refs.items():
        for set_name in cfg.drift.sets:
            ref, sample = continuations(backend, ref_name, ref_path, set_name, cfg, tokenizer, model_path)
            ratios = log_ratios(backend, sample, ref, adapters)
            result.setdefault(ref_name, {})[set_name] = {n: kl_estimate(r, seed=cfg.drift.seed) for n, r in ratios.items()}
            rows += [{"reference": ref_name, "set": set_name, "condition": n, "prompt": i,
                      "kl": float(np.mean(r)), "tokens": len(r)} for n, rs in ratios.items() for i, r in enumerate(rs)]
    io.write_json(out_dir / "eval_drift.json", result)
    io.write_parquet(out_dir / "eval_drift_prompts.parquet", rows)
    print(format_drift(result))
    return result


def format_drift(result: dict) -> str:
    """The printed drift table: one line per reference, set and condition (KL in nats, 95 % interval)."""
    lines = ["\ndrift: KL(reference || condition), nats per token (prompt mean [95 % bootstrap])"]
    for ref, sets in result.items():
        for set_name, per in sets.items():
            for cond, e in per.items():
                lo, hi = e["kl_prompt_ci95"]
                lines.append(f"  {ref:<12} {set_name:<14} {cond:<22} {e['kl_prompt']:+.4f} [{lo:+.4f}, {hi:+.4f}]"
                             f"  token-weighted {e['kl_token']:+.4f}  ({e['n_prompts']} prompts, {e['n_tokens']} tokens)")
    return "\n".join(lines)
