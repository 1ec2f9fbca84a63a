"""SFT warm start: a short supervised LoRA fine-tune on worked solutions (ESSA §3.1, step 1).

Trained with TRL's ``SFTTrainer`` and peft (LoRA on q/k/v/o of every layer) on conversational
prompt-completion rows (system prompt + question -> worked solution ending in ``\\boxed{}``), with
the loss on the completion only. The finished adapter is cached under
``$ESSA_CACHE/sft/<hash>`` where the hash covers the model, the task rows, every SFT/LoRA field and
the training dtype (resolved from ``model.dtype`` before hashing: ``auto`` is float32 on every CPU,
bf16/fp16 on GPUs, engine/hardware.py), so a second run with the same config skips training and a
warm start trained in another dtype is never reused. float32 leaves the key as it was before the
dtype entered it, so existing CPU caches stay valid. A warm start stopped by Ctrl-C, SIGTERM or an
error removes its temp directory (``.<hash>.tmp-<pid>-*``); one killed outright (SIGKILL) leaves it,
and the next cache lookup removes it.

With ``sft.enabled=false`` the adapter is peft's initialisation (A Kaiming-uniform, B = 0), the
no-warm-start variant of ESSA. With ``sft.adapter=PATH`` that PEFT adapter is the warm start (nothing is
trained): how a round of ``essa train rounds.count=R`` starts from the previous round's fold.

:func:`fold` continues training an existing adapter on given rows (a round's correct completions):
the "select, then distil" step of perturb-select-fold methods (Iterative RandOpt, es-levers-2.md).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
import sys
import time
from pathlib import Path

from engine.config import ConfigError, check_sft_adapter
from engine.interrupts import sigterm_unwinds
from engine.io import atomic_dir, remove_stale_temp_dirs
from engine.model import cache_dir
from engine.prompts import chat_messages
from engine.tasks import Problem

log = logging.getLogger(__name__)


def sft_hash(model_path: str, problems: list[Problem], sft_cfg, lora_cfg, system_prompt: str,
             dtype: str = "float32") -> str:
    """Hex digest (16 chars) identifying a warm start: model, rows used, SFT and LoRA settings and the
    training ``dtype`` (a resolved name, never "auto"; float32 adds nothing, so keys made before the
    dtype was hashed stay valid; ignored with ``sft.enabled=false``, whose adapter is peft's init)."""
    h = hashlib.sha256()
    rows = [(p.id, p.question, p.solution) for p in problems]
    payload = {"model": model_path, "rows": rows, "system": system_prompt,
               "sft": {k: getattr(sft_cfg, k) for k in ("enabled", "max_steps", "batch_size", "lr", "max_length", "seed")},
               "lora": {"rank": lora_cfg.rank, "alpha": lora_cfg.alpha, "targets": list(lora_cfg.target_modules)}}
    if dtype == "auto":
        raise ValueError("sft_hash: resolve model.dtype first (engine.hardware.resolve_dtype); 'auto' differs by machine")
    if sft_cfg.enabled and dtype != "float32":
        payload["dtype"] = dtype
    h.update(json.dumps(payload, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def sft_examples(problems: list[Problem], sft_cfg) -> list[Problem]:
    """The rows one warm start trains on: problems with a worked solution, max_steps x batch_size."""
    usable = [p for p in problems if p.solution]
    return usable[: sft_cfg.max_steps * sft_cfg.batch_size]


def sft_rows(problems: list[Problem], system_prompt: str) -> list[dict]:
    """TRL conversational prompt/completion rows of ``problems``: the chat prompt (system prompt +
    question) and the worked solution as the assistant's completion (the loss covers it only)."""
    return [{"prompt": chat_messages(p.question, system_prompt),
             "completion": [{"role": "assistant", "content": p.solution}]} for p in problems]


def warm_start(model_path: str, problems: list[Problem], sft_cfg, lora_cfg, system_prompt: str,
               out_dir: str | Path | None = None, dtype: str | None = None) -> Path:
    """Return a PEFT adapter directory holding the warm-start LoRA (trained or cached).

    Args:
        model_path: base model directory or HF id.
        problems: train rows; those with a ``solution`` are used.
        sft_cfg: ``engine.config.SFTConfig``. lora_cfg: ``engine.config.LoRAConfig``.
        system_prompt: the task's system message (the same one ES prompts use).
        out_dir: cache root; default ``$ESSA_CACHE/sft``.
        dtype: training dtype of the base model ("float32", "bfloat16", "float16"); None = ``auto``
            for training (:func:`engine.hardware.resolve_dtype`: float32 on CPU, bf16/fp16 on GPU).
            The LoRA weights train and are saved in float32 whatever it is (peft upcasts them).

    Returns:
        The adapter directory (adapter_config.json + adapter_model.safetensors).

    Raises:
        ValueError: SFT enabled but no row has a worked solution (``sft.enabled=false`` is the fix).
    """
    if getattr(sft_cfg, "adapter", None):
        return given_adapter(sft_cfg.adapter, lora_cfg)
    examples = sft_examples(problems, sft_cfg) if sft_cfg.enabled else []
    if sft_cfg.enabled and not examples:
        raise ValueError("sft.enabled=true but the task has no worked solutions; set sft.enabled=false "
                         "or use a task whose rows carry solutions")
    if dtype is None:
        from engine.hardware import resolve_dtype
        dtype, _ = resolve_dtype("auto", purpose="training", log_choice=False)
    root = Path(out_dir) if out_dir else cache_dir() / "sft"
    key = sft_hash(model_path, examples, sft_cfg, lora_cfg, system_prompt, dtype)
    final = root / key
    for stale in remove_stale_temp_dirs(root):  # left by a warm start that was killed (SIGKILL)
        log.info("SFT warm start: removed %s, left by an interrupted warm start", stale)
    if sft_cfg.cache and (final / "adapter_config.json").exists():
        log.info("SFT warm start: cached adapter %s", final)
        return final
    # Ctrl-C, SIGTERM or an error: the half-trained temp dir is removed, nothing is cached
    with sigterm_unwinds(), atomic_dir(final) as tmp:
        log.info("SFT warm start: training %d steps x %d examples (%s) into %s; Ctrl-C stops it, nothing is cached "
                 "until it finishes", sft_cfg.max_steps, sft_cfg.batch_size, dtype, final)
        _train(model_path, examples, sft_cfg, lora_cfg, system_prompt, tmp, dtype)
    return final


def given_adapter(path: str | Path, lora_cfg) -> Path:
    """``sft.adapter``: the PEFT adapter directory ``path`` as the warm start (nothing trained), checked by
    :func:`engine.config.check_sft_adapter` (rank, alpha and modules must be the ``lora`` group's).

    Raises:
        ConfigError: one line naming the field (see there).
    """
    path = check_sft_adapter(path, lora_cfg)
    log.info("SFT warm start: the given adapter %s (nothing trained)", path)
    return path


def fold(model_path: str, adapter_dir: str | Path, problems: list[Problem], sft_cfg, system_prompt: str,
         out: str | Path, steps: int, lr: float, dtype: str = "float32") -> Path:
    """Continue training the adapter ``adapter_dir`` (on the base model ``model_path``) on ``problems`` (their ``solution`` is the completion
    to learn: a round's own correct completions) for ``steps`` optimiser steps of ``sft.batch_size`` rows
    at learning rate ``lr``; the result is written atomically to ``out`` (a finished ``out`` is reused).
    The fold of Iterative RandOpt (select the population's correct answers, distil them by SFT;
    ../shared/notes/es-levers-2.md), with TRL's SFTTrainer, loss on the completion only.

    Returns:
        ``out`` (a PEFT adapter directory of the same rank and modules, plus ``sft_meta.json``).

    Raises:
        ValueError: no rows to train on.
    """
    out = Path(out)
    if (out / "adapter_config.json").exists():
        log.info("fold: finished adapter %s (reused)", out)
        return out
    if not problems:
        raise ValueError("fold: no rows to train on (the round produced no correct completion)")
    with sigterm_unwinds(), atomic_dir(out) as tmp:
        log.info("fold: %d steps of %d rows each (lr %g, %s) from %s, on %d distinct completions, into %s", steps,
                 sft_cfg.batch_size, lr, dtype, adapter_dir, len(problems), out)
        meta = _fold_train(model_path, problems, sft_cfg, steps, lr, system_prompt, tmp, dtype, Path(adapter_dir))
    log.info("fold done: %s", meta)
    return out


def check_target_modules(model, target_modules) -> None:
    """Every name in ``lora.target_modules`` matches a module of the model as peft matches a list of
    names: the module's full name, or a dotted suffix of it (``q_proj``, ``self_attn.q_proj``,
    ``model.layers.0.self_attn.q_proj``).

    Raises:
        ConfigError: a name matches no module; the message lists the model's linear layers (peft would
            stop later with a traceback that does not name the field).
    """
    import torch

    names = [name for name, _ in model.named_modules() if name]
    unknown = [t for t in target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if unknown:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ConfigError(f"lora.target_modules: {unknown} match no module of this model; its linear layers "
                          f"are {linear}, e.g. lora.target_modules=[q_proj,k_proj,v_proj,o_proj]")


@contextlib.contextmanager
def _progress_bars(enabled: bool):
    """Within the block, the progress bars of transformers (loading weights) and HF datasets (tokenizing)
    are on only if ``enabled``; afterwards as they were. The Trainer's own bar is ``disable_tqdm``."""
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    was_on = (not are_progress_bars_disabled(), hf_logging.is_progress_bar_enabled())
    if not enabled:
        disable_progress_bars()
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not enabled:
            if was_on[0]:
                enable_progress_bars()
            if was_on[1]:
                hf_logging.enable_progress_bar()


def _train(model_path, examples, sft_cfg, lora_cfg, system_prompt, out: Path, dtype: str = "float32") -> None:
    """The warm start: a fresh peft LoRA on ``model_path`` trained on ``examples``, saved into ``out``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(sft_cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    peft_cfg = LoraConfig(r=lora_cfg.rank, lora_alpha=lora_cfg.alpha, lora_dropout=0.0, bias="none",
                          target_modules=list(lora_cfg.target_modules), task_type="CAUSAL_LM")
    if not sft_cfg.enabled:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        check_target_modules(model, lora_cfg.target_modules)
        get_peft_model(model, peft_cfg).save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
        log.info("SFT disabled: saved peft's initial adapter (A Kaiming, B = 0)")
        return

    def load():
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        check_target_modules(model, lora_cfg.target_modules)
        return model

    meta = _fit(load, tokenizer, examples, system_prompt, sft_cfg.max_steps, sft_cfg.batch_size, sft_cfg.lr,
                sft_cfg.max_length, sft_cfg.seed, dtype, out, peft_config=peft_cfg)
    log.info("SFT warm start done: %s", meta)


def _fold_train(model_path, examples, sft_cfg, steps: int, lr: float, system_prompt, out: Path, dtype: str,
                start: Path) -> dict:
    """:func:`fold`'s training: the adapter ``start`` loaded trainable on ``model_path``, then :func:`_fit`."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(sft_cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)

    def load():
        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        return PeftModel.from_pretrained(base, str(start), is_trainable=True)

    return _fit(load, tokenizer, examples, system_prompt, steps, sft_cfg.batch_size, lr, sft_cfg.max_length,
                sft_cfg.seed, dtype, out)


def _fit(load_model, tokenizer, examples, system_prompt, steps: int, batch_size: int, lr: float, max_length: int,
         seed: int, dtype: str, out: Path, peft_config=None) -> dict:
    """TRL's SFTTrainer on ``examples`` (loss on the completion only, constant ``lr``, ``steps`` steps of
    ``batch_size`` rows); saves the adapter, the tokenizer and ``sft_meta.json`` into ``out``; returns the meta
    (steps, examples, dtype, seconds, first/last/mean loss). ``load_model()`` builds the model to train (a peft
    model already, or a base model that ``peft_config`` wraps)."""
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    rows = sft_rows(examples, system_prompt)
    bars = sys.stderr.isatty()  # progress bars for a terminal; a redirected log (make run > log) gets none
    args = SFTConfig(
        output_dir=str(out / "trainer"), max_steps=steps, per_device_train_batch_size=batch_size,
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, max_length=max_length,
        logging_steps=max(1, steps // 10), save_strategy="no", report_to=[], seed=seed,
        use_cpu=not torch.cuda.is_available(), bf16=dtype == "bfloat16",
        fp16=dtype == "float16" and torch.cuda.is_available(), dataloader_num_workers=0,
        completion_only_loss=True, disable_tqdm=not bars,
    )
    with _progress_bars(bars):
        model = load_model()
        t0 = time.perf_counter()
        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tokenizer, peft_config=peft_config)
        result = trainer.train()
    trainer.model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    meta = {"steps": steps, "examples": len(examples), "dtype": dtype, "seconds": time.perf_counter() - t0,
            "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
            "train_loss": result.training_loss}
    (out / "sft_meta.json").write_text(json.dumps(meta, indent=2))
    shutil.rmtree(out / "trainer", ignore_errors=True)
    return meta
