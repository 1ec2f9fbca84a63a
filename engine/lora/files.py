"""PEFT adapter files: write and read LoRA states in the format peft and vLLM load.

A LoRA state is ``dict[str, torch.Tensor]`` with PEFT keys
``base_model.model.model.layers.{l}.self_attn.{m}.lora_A.weight`` of shape (r, in) and
``...lora_B.weight`` of shape (out, r) (docs/ARCHITECTURE.md). The update is
W' = W + (lora_alpha / r) B A (Hu et al. 2021, LoRA, Eq. 3).
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engine.io import atomic_dir

DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass
class AdapterMeta:
    """What every candidate adapter shares: LoRA rank r, lora_alpha, target modules, base model."""

    rank: int
    lora_alpha: float
    target_modules: tuple[str, ...]
    base_model: str


def default_adapter_root(configured: str | None) -> Path:
    """Where candidate adapters live: ``engine.adapter_dir``, else /dev/shm (RAM), else the temp dir."""
    if configured:
        return Path(configured)
    return Path("/dev/shm") if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())


def adapter_config(rank: int, lora_alpha: float, target_modules, base_model: str) -> dict:
    """The ``adapter_config.json`` dict of a plain PEFT LoRA adapter (no bias, no dropout)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base_model),
        "r": int(rank),
        "lora_alpha": float(lora_alpha),
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": sorted(target_modules),
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }


def write_adapter(path, lora: dict[str, torch.Tensor], rank: int, lora_alpha: float,
                  base_model: str, target_modules=DEFAULT_TARGET_MODULES,
                  dtype: torch.dtype = torch.float32) -> Path:
    """Write a PEFT adapter directory atomically (temp dir + rename).

    Args:
        path: destination directory; replaced if it exists.
        lora: LoRA state (PEFT keys -> tensors (r, in) / (out, r)).
        rank, lora_alpha: LoRA r and alpha (scale = lora_alpha / r).
        base_model: recorded as ``base_model_name_or_path``.
        dtype: tensor dtype on disk.

    Returns:
        The adapter directory.
    """
    path = Path(path)
    with atomic_dir(path) as tmp:
        tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in lora.items()}
        save_file(tensors, str(tmp / "adapter_model.safetensors"))
        cfg = adapter_config(rank, lora_alpha, target_modules, base_model)
        (tmp / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
    return path


def read_adapter(path) -> tuple[dict[str, torch.Tensor], dict]:
    """Read a PEFT adapter directory.

    Returns:
        (LoRA state as float32 tensors with PEFT keys, adapter_config dict).

    Raises:
        FileNotFoundError: the directory has no adapter_model.safetensors / adapter_config.json.
    """
    path = Path(path)
    st, cfg = path / "adapter_model.safetensors", path / "adapter_config.json"
    if not st.exists() or not cfg.exists():
        raise FileNotFoundError(f"{path} is not a PEFT adapter (needs adapter_model.safetensors and adapter_config.json)")
    lora = {k: v.float() for k, v in load_file(str(st)).items()}
    # peft saves keys without the adapter name (".lora_A.weight"); normalise ".lora_A.default.weight".
    lora = {k.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B."): v for k, v in lora.items()}
    return lora, json.loads(cfg.read_text())
