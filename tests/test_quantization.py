"""Quantized base models (model.quantization, engine/model.py): the quantizer, the support check,
and LoRA adapters served by vLLM on the quantized base (CPU back-end, real engine).

The integration test starts one engine per precision in a subprocess (this file run as a script) and
compares log-probabilities of fixed answers, not greedy strings (a weak adapter left two greedy strings
equal to the base model's on an AMD EPYC without AMX: issue 29): the engine's start-up self-check
(engine/evaluation/selfcheck.py: an adapter with B = 0 changes nothing, one known to move the output
moves it) must pass, and a weak random adapter (std 0.03) must still shift the answers' log-probabilities.
Where this CPU cannot serve a precision, the test asserts the documented one-line refusal instead
(:func:`expected_refusal`): int8 without AMX; int4 in float32, so int4 is served in bfloat16 where
``model.dtype=auto`` picks float32 (an AVX2-only CPU). The refusals on every CPU class, simulated:
``test_refusals_per_cpu_class``.
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
ANSWERS = ["12 + 30 = 42. The final answer is \\boxed{42}.", "3 + 4 = 7 apples. The final answer is \\boxed{7}."]
WEAK_MIN_NATS = 0.05  # mean |shift| per answer token of the std-0.03 adapter: 0.28 (int8), 0.35 (int4) measured; B = 0: 0.0

# The CPU classes essa users have (engine/hardware.py flags), as /proc/cpuinfo spells them.
BASE_FLAGS = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx fma f16c avx2"
CPU_CLASSES = {
    "AMX": f"{BASE_FLAGS} avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8",
    "AVX512-BF16, no AMX": f"{BASE_FLAGS} avx512f avx512bw avx512vl avx512_vnni avx512_bf16",  # AMD EPYC Zen 4
    "AVX2": BASE_FLAGS,
}


def expected_refusal(name: str, amx: bool, dtype: str, wna16: bool = True) -> str | None:
    """What :func:`engine.model.check_quantization` must say on a CPU with or without AMX, whose vLLM kernel
    library has the W4A16 GEMM or not (``wna16``), when vLLM runs ``dtype``: None (served) or the start of its
    one-line refusal."""
    if name == "int8" and not amx:
        return "model.quantization=int8: vLLM 0.32's CPU INT8 kernel without AMX"
    if name == "int4" and not wna16:
        return "model.quantization=int4: the vLLM CPU kernels this CPU loads have no W4A16 GEMM (cpu_gemm_wna16"
    if name == "int4" and dtype == "float32":
        return "model.quantization=int4 with model.dtype resolving to float32"
    return None


def this_cpu_wna16() -> bool:
    """Whether the vLLM kernel library this CPU loads (under the environment's ISA cap) has the W4A16 GEMM
    (``_C_AVX2``, on an AVX2 CPU or capped to it, has not)."""
    from engine import hardware

    return hardware.kernel_has_op(hardware.this_kernel_library(), "cpu_gemm_wna16")


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


@pytest.mark.parametrize("quantization, gpu, amx, wna16, error", [
    (None, False, False, True, None),                     # float: always served
    ("int8", False, True, True, None),                    # CPU with AMX: the AMX int8 GEMM keeps the weight
    ("int4", False, True, True, None),                    # CPU WNA16 kernel
    ("int4", False, False, True, None),                   # ... with or without AMX
    ("int8", False, False, True, "use model.quantization=int4"),  # CPU without AMX: oneDNN path drops layer.weight
    ("int8", True, False, True, None),                    # GPU: CUTLASS / Marlin kernels
    ("int3", False, True, True, "use int8 (W8A8), int4 (W4A16) or null"),  # unknown value
    # issue 40: vLLM's _C_AVX2 (no AVX-512) has no cpu_gemm_wna16; the engine died at its first request
    ("int4", False, False, False, "have no W4A16 GEMM (cpu_gemm_wna16; _C_AVX2, for CPUs without AVX-512, lacks "
                                  "it), so the engine would die at its first request; use model.quantization=null"),
    ("int8", False, False, False, "use model.quantization=null on this CPU"),  # never int4 where it is refused too
])
def test_check_quantization(quantization, gpu, amx, wna16, error):
    from engine.model import check_quantization

    if error is None:
        check_quantization(quantization, gpu=gpu, amx=amx, wna16=wna16)
    else:
        with pytest.raises(ValueError) as e:
            check_quantization(quantization, gpu=gpu, amx=amx, wna16=wna16)
        assert error in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("model.quantization=")


@pytest.mark.parametrize("dtype, error, absent", [
    ("float32", "has no float32 version; set model.dtype=bfloat16", None),  # cpu_gemm_wna16: no float kernel
    ("bfloat16", None, None),
    (None, None, None),                                                        # dtype not known: not checked
])
def test_int4_in_float32_is_refused_on_cpu(dtype, error, absent):
    from engine.model import check_quantization

    if error is None:
        check_quantization("int4", gpu=False, amx=False, dtype=dtype, wna16=True)
        return
    with pytest.raises(ValueError) as e:
        check_quantization("int4", gpu=False, amx=True, dtype=dtype, wna16=True)
    assert error in str(e.value) and "\n" not in str(e.value)
    check_quantization("int4", gpu=True, amx=False, dtype=dtype)  # GPUs: Marlin/Machete, any dtype


@pytest.mark.parametrize("cpu_class, requested, int8, int4", [
    # class, model.dtype, then what int8 / int4 get: "served", or the refusal ("+int4": its line points to int4)
    ("AMX", "auto", "served", "served"),
    ("AMX", "bfloat16", "served", "served"),
    ("AVX512-BF16, no AMX", "auto", "refused+int4", "served"),       # AMD EPYC Zen 4: auto picks bfloat16
    ("AVX512-BF16, no AMX", "bfloat16", "refused+int4", "served"),
    ("AVX2", "auto", "refused", "refused"),                         # _C_AVX2 has no W4A16 GEMM (issue 40)
    ("AVX2", "bfloat16", "refused", "refused"),                     # ... in any dtype
])
def test_refusals_per_cpu_class(cpu_class, requested, int8, int4):
    """Every CPU class, simulated by its flags (engine.hardware.CPUInfo; AMX as vLLM's kernels see it), gets
    the documented outcome, and int8's refusal names int4 only where int4 is served."""
    from engine.hardware import CPUInfo, DeviceInfo, resolve_dtype
    from engine.model import check_quantization

    from engine import hardware

    cpu = CPUInfo(model=cpu_class, flags=frozenset(CPU_CLASSES[cpu_class].split()), cores=2)
    dtype, _ = resolve_dtype(requested, DeviceInfo(cpu=cpu), log_choice=False)
    amx = "amx_tile" in cpu.flags
    kernels = hardware.kernel_library("avx512f" in cpu.flags, "avx512_bf16" in cpu.flags)
    wna16 = kernels != "_C_AVX2"  # measured: only _C_AVX2 lacks cpu_gemm_wna16 (test_kernel_libraries_ops)
    for name, outcome in (("int8", int8), ("int4", int4)):
        assert (expected_refusal(name, amx, dtype, wna16) is None) == (outcome == "served"), (name, dtype)
        if outcome == "served":
            check_quantization(name, gpu=False, amx=amx, dtype=dtype, wna16=wna16)
            continue
        with pytest.raises(ValueError) as e:
            check_quantization(name, gpu=False, amx=amx, dtype=dtype, wna16=wna16)
        msg = str(e.value)
        assert msg.startswith(expected_refusal(name, amx, dtype, wna16)) and "\n" not in msg
        if name == "int8":  # its alternative: int4 only where int4 is served too
            assert ("int4" in msg.split("; use ")[-1]) == outcome.endswith("+int4"), msg


def test_kernel_libraries_ops():
    """The installed vLLM's kernel libraries, read by loading each: only _C_AVX2 lacks the W4A16 GEMM; and the
    library a process loads follows the ISA cap (the AVX2 emulation loads _C_AVX2, as an AVX2 CPU does)."""
    from engine import hardware

    assert {lib: hardware.kernel_has_op(lib, "cpu_gemm_wna16") for lib in hardware.KERNEL_LIBRARIES} == \
        {"_C": True, "_C_AVX512": True, "_C_AVX2": False}
    assert hardware.capped_isa(True, True, {}) == (True, True)
    assert hardware.capped_isa(True, True, {"ONEDNN_MAX_CPU_ISA": "AVX2"}) == (False, False)
    assert hardware.capped_isa(True, True, {"ATEN_CPU_CAPABILITY": "avx2"}) == (False, False)
    assert hardware.capped_isa(True, True, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}) == (True, False)
    assert hardware.capped_isa(False, False, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}) == (False, False)
    assert [hardware.kernel_library(*isa) for isa in ((True, True), (True, False), (False, False))] == \
        ["_C", "_C_AVX512", "_C_AVX2"]


AVX2_EMULATION = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
"""The README's capping that emulates an AVX2-only CPU on an AVX-512 one."""


@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
def test_int4_on_the_avx2_kernels_stops_at_start_in_one_line(dtype, tmp_path):
    """Issue 40: on an AVX2-only CPU int4 was accepted (bf16, emulated), the engine started and died at its first
    request. Under the AVX2 emulation it is refused before the warm start, in one line, in any dtype."""
    import os

    r = subprocess.run([sys.executable, "-m", "engine.cli", "train", "model.quantization=int4", f"model.dtype={dtype}",
                        "+experiment=tiny", f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True,
                       text=True, timeout=300, env={**os.environ, **AVX2_EMULATION})
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("essa: error:")]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("essa: error: " + expected_refusal("int4", False, dtype, wna16=False))
    assert "warm start" not in r.stdout + r.stderr and "vLLM engine up" not in r.stdout + r.stderr


@pytest.mark.parametrize("argv, env", [
    (["train", "model.quantization=int4", "model.dtype=float32", "+experiment=tiny"], {}),
    (["bench", "populations=[4]", "phases_population=4", "prompts_per_candidate=8", "max_tokens=48",
      "naive.enabled=false", "model.quantization=int4", "model.dtype=float32"], {}),
    (["eval", "model.quantization=int4", "model.dtype=float32", "limit=1"], {}),
])
def test_int4_in_float32_stops_at_start_in_one_line(argv, env, tmp_path):
    """Issue 29a's reproductions: refused before the warm start and before any engine, exit 2, one line (the
    second emulates an AVX2-only CPU, where model.dtype=auto picks float32)."""
    import os

    r = subprocess.run([sys.executable, "-m", "engine.cli", *argv, f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO,
                       capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("essa: error:")]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    # on an AVX2 CPU (or under its emulation) the kernel library's missing W4A16 GEMM is said first
    expected = ("model.quantization=int4 with model.dtype resolving to float32: " if this_cpu_wna16()
                else expected_refusal("int4", False, "float32", wna16=False))
    assert lines[0].startswith("essa: error: " + expected), lines[0]
    assert "warm start" not in r.stdout + r.stderr and "vLLM engine up" not in r.stdout + r.stderr


def test_bad_quantization_is_one_line_at_start(tmp_path):
    """``essa eval model.quantization=int3`` stops before any engine with one line and status 2."""
    r = subprocess.run([sys.executable, "-m", "engine.cli", "eval", "model.quantization=int3", "limit=1",
                        f"hydra.run.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("essa: error:")]
    assert lines == ["essa: error: model.quantization='int3': use int8 (W8A8), int4 (W4A16) or null (the float model)"]


def serve(qdir: str, float_path: str, out_json: str, adapter_dir: str, dtype: str) -> None:
    """One engine on the quantized base: the start-up self-check, then the base model, a B = 0 adapter
    and a weak random adapter scored on fixed answers, and 16 greedy tokens of the base model."""
    sys.path.insert(0, str(REPO))
    import numpy as np
    import torch

    from engine.backends import AdapterRef, Sampling
    from engine.backends.vllm_local import VLLMBackend
    from engine.evaluation.prefill import encode_pairs, target_logprobs
    from engine.evaluation.selfcheck import measure_lora_serving
    from engine.lora.files import write_adapter
    from engine.prompts import build_prompt
    from tests.helpers import random_lora
    from transformers import AutoConfig

    weak = random_lora(AutoConfig.from_pretrained(float_path), seed=1)  # std 0.03: the adapter of the old test
    zero = {k: (torch.zeros_like(v) if ".lora_B." in k else v) for k, v in weak.items()}
    refs = [None]
    for i, lora in enumerate((zero, weak)):  # adapters name the FLOAT base, as every essa adapter does
        d = write_adapter(Path(adapter_dir) / f"a{i}", lora, 8, 16.0, float_path)
        refs.append(AdapterRef(f"a{i}", i + 1, str(d)))
    backend = VLLMBackend(qdir, max_lora_rank=8, max_loras=4, max_model_len=512, kv_cache_gib=1.0, dtype=dtype)
    try:
        check = measure_lora_serving(backend, weak, 8, 16.0, float_path, adapter_dir)
        prompts = [build_prompt(backend.tokenizer, q, "Answer briefly.") for q in QUESTIONS]
        pairs = encode_pairs(backend.tokenizer, prompts, ANSWERS)
        lps = target_logprobs(backend, [p for _ in refs for p in pairs], [r for r in refs for _ in pairs])
        n = len(pairs)
        shift = {name: float(np.mean(np.abs(np.concatenate(lps[k * n:(k + 1) * n]) - np.concatenate(lps[:n]))))
                 for k, name in ((1, "zero"), (2, "weak"))}
        outs = backend.generate(prompts, [None] * n, Sampling(max_tokens=MAX_TOKENS, temperature=0.0), use_tqdm=False)
        Path(out_json).write_text(json.dumps({
            "selfcheck": {"ok": check.ok, "zero_max": check.zero_max, "moved_mean": check.moved_mean,
                          "tokens": check.tokens, "seconds": check.seconds},
            "shift": shift, "zero_max": float(max(np.abs(lps[n + i] - lps[i]).max() for i in range(n))),
            "base": [o[0].text for o in outs], "n_tokens": [o[0].n_tokens for o in outs], "dtype": backend.dtype}))
    finally:
        backend.close()


@pytest.mark.integration
@pytest.mark.parametrize("name", ["int8", "int4"])
def test_lora_on_quantized_base(name, float_model, tmp_path):
    """vLLM (CPU back-end, essa's fast LoRA kernels) serves PEFT adapters on the quantized base, or this
    CPU refuses the precision in its documented line (int8 without AMX)."""
    import torch

    from engine.evaluation.selfcheck import MOVE_MIN_NATS, ZERO_MAX_NATS
    from engine.hardware import resolve_dtype
    from engine.model import check_quantization, quantize_model

    auto, _ = resolve_dtype("auto", log_choice=False)
    amx = bool(torch.cpu._is_amx_tile_supported())  # what vLLM's CPU kernels (and the check) read
    wna16 = this_cpu_wna16()
    refusal = expected_refusal(name, amx, auto, wna16)
    if refusal is not None:  # the documented refusal on this CPU, then the precision where it is served
        with pytest.raises(ValueError) as e:
            check_quantization(name, dtype=auto)
        assert str(e.value).startswith(refusal) and "\n" not in str(e.value)
        if name == "int8" or not wna16:
            return  # int8 without AMX, int4 without the W4A16 GEMM: no dtype serves it
    dtype = "bfloat16" if auto == "float32" else auto  # int4: bf16 where auto picks float32 (emulated there)
    check_quantization(name, dtype=dtype)
    qdir = quantize_model(float_model, tmp_path / name, name)
    out = tmp_path / "out.json"
    r = subprocess.run([sys.executable, __file__, str(qdir), float_model, str(out), str(tmp_path / "adapters"), dtype],
                       cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    print(f"{name} ({res['dtype']}): {res}")
    assert res["dtype"] == dtype and all(n > 0 for n in res["n_tokens"]) and all(t.strip() for t in res["base"])
    check = res["selfcheck"]
    assert check["ok"] and check["zero_max"] <= ZERO_MAX_NATS and check["moved_mean"] >= MOVE_MIN_NATS, check
    assert res["zero_max"] <= ZERO_MAX_NATS                  # B = 0: the quantized base alone
    assert res["shift"]["weak"] >= WEAK_MIN_NATS, res["shift"]  # even a weak adapter is applied


if __name__ == "__main__":
    serve(*sys.argv[1:6])
