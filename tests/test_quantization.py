"""Quantized base models (model.quantization, engine/model.py): the quantizer, the support check,
and LoRA adapters served by vLLM on the quantized base (CPU back-end, real engine).

The integration test starts one engine per precision in a subprocess (this file run as a script):
base model, an adapter whose B factors are zero and a random adapter, 2 prompts, 16 greedy tokens.
The zero adapter must give exactly the base model's completion (the LoRA path adds nothing and the
quantized base is the same) and the random adapter a different one (the adapter is applied).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MAX_TOKENS = 16
QUESTIONS = ["What is 12 + 30?", "Tom has 3 apples and buys 4 more. How many apples does he have?"]


@pytest.fixture(scope="module")
def float_model() -> str:
    from engine.model import resolve_model_path

    return resolve_model_path("embedded:smollm2-135m-instruct")


@pytest.fixture(scope="module", params=["int8", "int4"])
def quantized(request, float_model, tmp_path_factory) -> tuple[str, Path]:
    from engine.model import quantize_model

    out = tmp_path_factory.mktemp("q") / request.param
    return request.param, quantize_model(float_model, out, request.param)


def _dequantized(qdir: Path, prefix: str):
    """(weight, scale) of one layer dequantized to float32, read straight from the safetensors file."""
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from safetensors.torch import load_file

    t = load_file(str(qdir / "model.safetensors"))
    scale = t[f"{prefix}.weight_scale"].float()                      # (out, 1) | (out, in / g)
    if f"{prefix}.weight_packed" in t:
        shape = torch.Size(t[f"{prefix}.weight_shape"].tolist())
        q = unpack_from_int32(t[f"{prefix}.weight_packed"], 4, shape).float()  # (out, in) in [-8, 7]
        assert q.min() >= -8 and q.max() <= 7
    else:
        assert t[f"{prefix}.weight"].dtype == torch.int8
        q = t[f"{prefix}.weight"].float()                             # (out, in) in [-128, 127]
    g = q.shape[1] // scale.shape[1]
    return q * scale.repeat_interleave(g, dim=1), scale.repeat_interleave(g, dim=1)


def test_quantize_embedded_model(quantized, float_model):
    """The checkpoint holds INT8 / packed INT4 tensors in the compressed-tensors format, each weight is
    within half a quantization step of the float one, lm_head/embeddings stay float, and transformers
    loads it as a compressed-tensors model whose greedy next token matches the float model's."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name, qdir = quantized
    cfg = json.loads((qdir / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "compressed-tensors" and cfg["ignore"] == ["lm_head"]
    weights = cfg["config_groups"]["group_0"]["weights"]
    assert weights["num_bits"] == (8 if name == "int8" else 4)
    assert cfg["format"] == ("int-quantized" if name == "int8" else "pack-quantized")
    if name == "int4":
        assert weights["group_size"] == 64  # 576 (SmolLM2's hidden size) is not a multiple of 128
    marker = json.loads((qdir / ".complete").read_text())
    assert marker["quantization"] == name and marker["source"] == float_model

    ref = load_file(str(Path(float_model) / "model.safetensors"))
    for prefix in ("model.layers.0.self_attn.q_proj", "model.layers.17.mlp.down_proj", "model.layers.29.self_attn.k_proj"):
        w = ref[f"{prefix}.weight"].float()
        wq, step = _dequantized(qdir, prefix)
        assert wq.shape == w.shape
        err = (wq - w).abs()
        # half a step, plus the bf16 rounding of the stored scale (relative 2^-9) times |w| / step steps
        assert (err <= 0.5 * step + 2 ** -8 * w.abs() + 1e-6).all(), f"{prefix}: max error {err.max():.3g}"
        rel = (err.norm() / w.norm()).item()
        assert rel < (0.02 if name == "int8" else 0.15), f"{prefix}: relative error {rel:.3g}"
    q_tensors = load_file(str(qdir / "model.safetensors"))
    assert q_tensors["model.embed_tokens.weight"].dtype == torch.bfloat16

    tok = AutoTokenizer.from_pretrained(str(qdir))
    ids = tok(["The capital of France is"], return_tensors="pt").input_ids
    with torch.no_grad():
        qm = AutoModelForCausalLM.from_pretrained(str(qdir), dtype=torch.bfloat16)
        assert getattr(qm.config, "quantization_config", None) is not None
        fm = AutoModelForCausalLM.from_pretrained(float_model, dtype=torch.bfloat16)
        q_logits, f_logits = qm(ids).logits[0, -1].float(), fm(ids).logits[0, -1].float()
    assert torch.isfinite(q_logits).all()
    assert q_logits.argmax() == f_logits.argmax()


@pytest.mark.parametrize("quantization, gpu, amx, error", [
    (None, False, False, None),                     # float: always served
    ("int8", False, True, None),                    # CPU with AMX: the AMX int8 GEMM keeps the weight
    ("int4", False, True, None),                    # CPU WNA16 kernel
    ("int4", False, False, None),                   # ... with or without AMX
    ("int8", False, False, "use model.quantization=int4"),  # CPU without AMX: oneDNN path drops layer.weight
    ("int8", True, False, None),                    # GPU: CUTLASS / Marlin kernels
    ("int3", False, True, "use int8 (W8A8), int4 (W4A16) or null"),  # unknown value
])
def test_check_quantization(quantization, gpu, amx, error):
    from engine.model import check_quantization

    if error is None:
        check_quantization(quantization, gpu=gpu, amx=amx)
    else:
        with pytest.raises(ValueError) as e:
            check_quantization(quantization, gpu=gpu, amx=amx)
        assert error in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("model.quantization=")


def test_bad_quantization_is_one_line_at_start(tmp_path):
    """``essa eval model.quantization=int3`` stops before any engine with one line and status 2."""
    r = subprocess.run([sys.executable, "-m", "engine.cli", "eval", "model.quantization=int3", "limit=1",
                        f"hydra.run.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("essa: error:")]
    assert lines == ["essa: error: model.quantization='int3': use int8 (W8A8), int4 (W4A16) or null (the float model)"]


def serve(qdir: str, float_path: str, out_json: str, adapter_dir: str) -> None:
    """One engine on the quantized base: base, zero-B adapter and random adapter on the same prompts."""
    sys.path.insert(0, str(REPO))
    import torch

    from engine.lora.files import write_adapter
    from engine.backends import AdapterRef, Sampling
    from engine.backends.vllm_local import VLLMBackend
    from engine.prompts import build_prompt
    from tests.helpers import random_lora
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(float_path)
    rand = random_lora(config, seed=1)
    zero = {k: (torch.zeros_like(v) if ".lora_B." in k else v) for k, v in rand.items()}
    refs = [None]
    for i, lora in enumerate((zero, rand)):  # adapters name the FLOAT base, as every essa adapter does
        d = write_adapter(Path(adapter_dir) / f"a{i}", lora, 8, 16.0, float_path)
        refs.append(AdapterRef(f"a{i}", i + 1, str(d)))
    backend = VLLMBackend(qdir, max_lora_rank=8, max_loras=2, max_model_len=512, kv_cache_gib=1.0)
    try:
        prompts = [build_prompt(backend.tokenizer, q, "Answer briefly.") for q in QUESTIONS]
        flat = [p for _ in refs for p in prompts]
        adapters = [r for r in refs for _ in prompts]
        outs = backend.generate(flat, adapters, Sampling(max_tokens=MAX_TOKENS, temperature=0.0), use_tqdm=False)
        texts = [o[0].text for o in outs]
        n = len(prompts)
        Path(out_json).write_text(json.dumps({"base": texts[:n], "zero": texts[n:2 * n], "random": texts[2 * n:],
                                              "n_tokens": [o[0].n_tokens for o in outs]}))
    finally:
        backend.close()


@pytest.mark.integration
@pytest.mark.parametrize("name", ["int8", "int4"])
def test_lora_on_quantized_base(name, float_model, tmp_path):
    """vLLM (CPU back-end, essa's fast LoRA kernels) serves PEFT adapters on the quantized base."""
    from engine.model import check_quantization, quantize_model

    check_quantization(name)  # this machine must serve it (AMX for int8)
    qdir = quantize_model(float_model, tmp_path / name, name)
    out = tmp_path / "out.json"
    r = subprocess.run([sys.executable, __file__, str(qdir), float_model, str(out), str(tmp_path / "adapters")],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert all(n > 0 for n in res["n_tokens"])
    assert all(t.strip() for t in res["base"])
    assert res["zero"] == res["base"]                                  # B = 0: the quantized base alone
    assert any(a != b for a, b in zip(res["random"], res["base"]))     # the adapter is applied


if __name__ == "__main__":
    serve(*sys.argv[1:5])
