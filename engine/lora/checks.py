"""Checks of PEFT adapter files before an engine serves them: the features vLLM serves, and a weights file
whose tensors agree with the config (read from the safetensors header only)."""
from __future__ import annotations

import re
from pathlib import Path

from engine import io


_REFUSED = {
    "use_dora": ("DoRA (use_dora=true)", "merge it into the base model (peft merge_and_unload) and evaluate that "
                 "model, or train a plain LoRA"),
    "modules_to_save": ("fully trained modules (modules_to_save={value!r})", "merge the adapter into the base model "
                        "(peft merge_and_unload) and evaluate that model, or export it without modules_to_save"),
    "bias": ("trained biases (bias={value!r})", "merge the adapter into the base model (peft merge_and_unload), or "
             "train with bias=\"none\""),
    "lora_bias": ("LoRA biases (lora_bias=true)", "merge the adapter into the base model (peft merge_and_unload), or "
                  "train with lora_bias=false"),
}


def _bad_pattern(pattern, number: type | tuple) -> bool:
    """True unless ``pattern`` is None or a {module-name pattern: positive number} dict."""
    if pattern is None:
        return False
    return not isinstance(pattern, dict) or any(
        not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, number) or v <= 0 for k, v in pattern.items())


def adapter_rank(path: Path) -> int:
    """Largest LoRA rank an adapter uses: max(``r``, ``rank_pattern`` values) of its adapter_config.json.

    Also checks that essa eval's vLLM engine serves every PEFT feature the config turns on (the
    comment above ``_REFUSED``: ``rank_pattern``, ``alpha_pattern``, ``use_rslora`` and a regex
    ``target_modules`` work; DoRA, ``modules_to_save`` and biases are refused), so none is ignored.

    Raises:
        ValueError: one line naming the file, the field and the fix: invalid JSON, no positive
            integer ``r``, a malformed ``rank_pattern``/``alpha_pattern``/``target_modules``, or a
            feature vLLM does not serve.
    """
    f = Path(path) / "adapter_config.json"
    try:
        conf = io.read_json(f)
    except ValueError as e:
        raise ValueError(f"adapters: {e}; re-export the adapter or fix the file") from None
    r = conf.get("r") if isinstance(conf, dict) else None
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"adapters: {f} has no positive integer LoRA rank \"r\" (got {r!r}); re-export the adapter "
                         f"or add its rank, e.g. \"r\": 8")
    for name, number in (("rank_pattern", int), ("alpha_pattern", (int, float))):
        if _bad_pattern(conf.get(name), number):
            raise ValueError(f"adapters: {f} has {name}={conf.get(name)!r}; it must map module names to positive "
                             f"{'integer ranks' if number is int else 'alphas'}, e.g. {{\"q_proj\": 16}}; fix or "
                             f"re-export the adapter")
    for name, (what, fix) in _REFUSED.items():
        value = conf.get(name)
        if value not in (None, False, [], "none"):
            raise ValueError(f"adapters: {f} uses {what.format(value=value)}, which vLLM does not serve; {fix}")
    missing = [k for k in ("lora_alpha", "target_modules") if conf.get(k) in (None, "", [])]
    if missing:  # vLLM's PEFTHelper requires both; without this check the engine dies after start-up
        raise ValueError(f"adapters: {f} has no {' or '.join(missing)}; re-export the adapter with peft or add "
                         f"them, e.g. \"lora_alpha\": 16, \"target_modules\": [\"q_proj\", \"v_proj\"]")
    targets = conf.get("target_modules")
    if isinstance(targets, str):
        try:
            re.compile(targets)
        except re.error as e:
            raise ValueError(f"adapters: {f} has target_modules={targets!r}, not a valid regex ({e}); "
                             f"fix it or list the module names") from None
    return max([r, *(conf.get("rank_pattern") or {}).values()])


def check_adapter_weights(path: Path) -> None:
    """Checks an adapter's weights file before the engine starts, reading only the safetensors header.

    Raises:
        ValueError: one line naming the file (or tensor) and the fix: no ``adapter_model.safetensors``
            (or only a pickled ``adapter_model.bin``, which vLLM does not load here), an empty file, a
            file safetensors cannot open, or a ``lora_A``/``lora_B`` tensor whose rank disagrees with the config's ``r``
            (or its ``rank_pattern`` values).
    """
    path = Path(path)
    weights = path / "adapter_model.safetensors"
    if not weights.is_file():
        if (path / "adapter_model.bin").is_file():
            raise ValueError(f"adapters: {path} has only adapter_model.bin (pickle); convert it to safetensors, e.g. "
                             f"load it with peft and call save_pretrained(dir, safe_serialization=True)")
        raise ValueError(f"adapters: {path} has no adapter_model.safetensors (the LoRA weights); re-export the "
                         f"adapter with peft's save_pretrained or point adapters at a complete adapter directory")
    if weights.stat().st_size == 0:
        raise ValueError(f"adapters: {weights} is empty; re-export the adapter")
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="numpy") as f:
            shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - SafetensorError, OSError (permissions), header errors
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ValueError(f"adapters: {weights} is not a readable safetensors file ({why}); re-export the adapter "
                         f"or fix the file's permissions") from None
    conf = io.read_json(path / "adapter_config.json")
    ranks = {conf["r"], *(conf.get("rank_pattern") or {}).values()}
    for name, shape in shapes.items():
        if ".lora_A" in name and len(shape) == 2:
            rank = shape[0]
        elif ".lora_B" in name and len(shape) == 2:
            rank = shape[1]
        else:
            continue
        if rank not in ranks:
            want = f"r={conf['r']}" + (f" or a rank_pattern value {sorted(ranks - {conf['r']})}"
                                       if len(ranks) > 1 else "")
            raise ValueError(f"adapters: {weights} tensor {name} has shape {shape}, rank {rank}, but "
                             f"{path / 'adapter_config.json'} says {want}; re-export the adapter so config and "
                             f"weights agree")


def check_adapter_fits(path: Path, model_path: str) -> None:
    """Checks, from the safetensors header and the model's config.json only, that an adapter was trained
    for this base model: every ``layers.<l>`` exists and every q/k/v/o ``lora_A`` takes the model's
    input width (hidden size for q/k/v, heads x head dim for o).

    Raises:
        ValueError: one line naming the adapter, what does not fit and the fix.
    """
    import json
    import re

    from safetensors import safe_open

    conf_file = Path(model_path) / "config.json"
    if not conf_file.is_file():
        return  # a hub id: the engine's own check applies
    conf = json.loads(conf_file.read_text())
    hidden, layers = conf.get("hidden_size"), conf.get("num_hidden_layers")
    head_dim = conf.get("head_dim") or (hidden // conf["num_attention_heads"] if hidden and conf.get("num_attention_heads") else None)
    widths = {"q_proj": hidden, "k_proj": hidden, "v_proj": hidden,
              "o_proj": conf.get("num_attention_heads", 0) * head_dim if head_dim else None}
    with safe_open(str(Path(path) / "adapter_model.safetensors"), framework="numpy") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    for name, shape in shapes.items():
        m = re.search(r"layers\.(\d+)\..*?(q_proj|k_proj|v_proj|o_proj)\.lora_A", name)
        if not m:
            continue
        layer, module = int(m.group(1)), m.group(2)
        want = widths[module]
        if (layers is not None and layer >= layers) or (want and shape[1] != want):
            raise ValueError(f"adapters: {path} was trained for another base model ({name} has shape {shape}; "
                             f"{model_path} has {layers} layers, {module} input width {want}); evaluate it with "
                             f"its own model.path")
