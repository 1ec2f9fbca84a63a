"""PEFT adapter files: write and read LoRA states in the format peft and vLLM load.

A LoRA state is ``dict[str, torch.Tensor]`` with PEFT keys
``base_model.model.model.layers.{l}.self_attn.{m}.lora_A.weight`` of shape (r, in) and
``...lora_B.weight`` of shape (out, r) (docs/ARCHITECTURE.md). The update is
W' = W + (lora_alpha / r) B A (Hu et al. 2021, LoRA, Eq. 3).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engine.io import atomic_dir

DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
log = logging.getLogger("essa")


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


ADAPTER_OVERHEAD_BYTES = 64 * 1024
"""Per adapter beyond its tensors: adapter_config.json, the safetensors header, file-system blocks."""


def adapter_bytes(lora: dict[str, torch.Tensor]) -> int:
    """Bytes one adapter of ``lora``'s shape takes on disk as :func:`write_adapter` writes it (float32
    tensors plus :data:`ADAPTER_OVERHEAD_BYTES`); SmolLM2-135M at r 8 on q/k/v/o: about 3.8 MB."""
    return sum(4 * v.numel() for v in lora.values()) + ADAPTER_OVERHEAD_BYTES


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc`` says the device is full: ``OSError`` ENOSPC, or safetensors' own error type
    (``SafetensorError: Error while serializing: I/O error: No space left on device (os error 28)``)."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    text = str(exc)
    return "No space left on device" in text or "os error 28" in text or "StorageFull" in text


def no_space_line(root: Path, need: int, n_adapters: int, free: dict[Path, int]) -> str:
    """The one line that stops a run whose candidate adapters do not fit anywhere."""
    where = " and ".join(f"{free[d] / 1e6:.0f} MB free in {d}" for d in free)
    return (f"engine.adapter_dir={root}: the population's {n_adapters} candidate adapters need {need / 1e6:.0f} MB, "
            f"{where}; set engine.adapter_dir=<a directory with {need / 1e6:.0f} MB free> (Docker: raise --shm-size)")


def adapter_root_with_space(configured: str | None, need: int, n_adapters: int) -> Path:
    """The directory candidate adapters go to: :func:`default_adapter_root` when ``need`` bytes are
    free there (``shutil.disk_usage``), else the temp directory on disk when they fit there, with one
    warning line (/dev/shm is 64 MB in Docker by default: issue 29).

    Args:
        configured: ``engine.adapter_dir`` (None = /dev/shm or the temp dir); created when missing.
        need: bytes the population's adapters take at once (``n_adapters x adapter_bytes``).
        n_adapters: how many (P + 2: the candidates, the centre, the validated mean), for the messages.

    Raises:
        ValueError: no candidate directory has the space, or the configured one cannot be created (one
            line naming ``engine.adapter_dir``).
    """
    import shutil

    first = default_adapter_root(configured)
    free: dict[Path, int] = {}
    for root in dict.fromkeys([first, Path(tempfile.gettempdir())]):
        try:
            root.mkdir(parents=True, exist_ok=True)
            free[root] = shutil.disk_usage(root).free
        except OSError as e:
            if configured and root == first:  # the user's own choice: say so rather than fall back
                raise ValueError(f"engine.adapter_dir={configured}: cannot be created or used ({e.strerror or e}); "
                                 f"choose a writable directory, or leave it unset (/dev/shm)") from None
            continue
        if free[root] >= need:
            if root != first:
                log.warning("engine.adapter_dir: %s has %.0f MB free but the population's %d candidate adapters need "
                            "%.0f MB; writing them to %s instead (disk: slower than RAM); set engine.adapter_dir= to "
                            "choose", first, free.get(first, 0) / 1e6, n_adapters, need / 1e6, root)
            return root
    raise ValueError(no_space_line(first, need, n_adapters, free))


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


def is_adapter_dir(path: Path) -> bool:
    """Whether ``path`` is a PEFT adapter directory (it holds adapter_config.json)."""
    return (Path(path) / "adapter_config.json").is_file()


def adapter_specs(spec) -> list[str]:
    """The paths an ``adapters`` setting names: a single path, a list, an OmegaConf list, or
    ``none``/``null``/empty for none; whitespace stripped."""
    from omegaconf import OmegaConf

    if spec is None:
        return []
    if OmegaConf.is_config(spec):
        spec = OmegaConf.to_container(spec, resolve=True)
    if isinstance(spec, (str, Path)):
        spec = [spec]
    out = [str(s).strip() for s in spec]
    return [s for s in out if s and s.lower() not in ("none", "null")]
