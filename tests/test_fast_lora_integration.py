"""Greedy completions of a population: fast CPU LoRA kernels vs vLLM's stock kernels.

Real engine, default model, real GSM8K prompts. vLLM runs the LoRA ops in a worker process that
reads ``ESSA_FAST_LORA`` when it starts, so each engine runs in its own subprocess (this file run
as a script), one after the other: 4 adapters x 4 prompts plus the same prompts on the base model,
32 greedy tokens. bf16 kernels that sum in a different order may flip a near-tie token, so the
test asks for >= 90 % identical completions (and reports the rate), and checks that the adapters
change the model's output at all (otherwise the comparison would be vacuous).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GSM8K = Path(os.environ.get("ESSA_DATA", "/work/shared/data")) / "gsm8k" / "test.jsonl"
N_ADAPTERS, N_PROMPTS, MAX_TOKENS = 4, 4, 32


def _random_lora(config, seed: int, rank: int = 8, std: float = 0.03) -> dict:
    """A q/k/v/o LoRA state with N(0, std^2) factors: with alpha = 2r, ~10 % of a weight's scale."""
    import torch

    g = torch.Generator().manual_seed(seed)
    hd = config.hidden_size // config.num_attention_heads
    dims = {"q_proj": (config.hidden_size, config.num_attention_heads * hd),
            "k_proj": (config.hidden_size, config.num_key_value_heads * hd),
            "v_proj": (config.hidden_size, config.num_key_value_heads * hd),
            "o_proj": (config.num_attention_heads * hd, config.hidden_size)}
    lora = {}
    for layer in range(config.num_hidden_layers):
        for m, (d_in, d_out) in dims.items():
            pre = f"base_model.model.model.layers.{layer}.self_attn.{m}"
            lora[f"{pre}.lora_A.weight"] = torch.randn(rank, d_in, generator=g) * std
            lora[f"{pre}.lora_B.weight"] = torch.randn(d_out, rank, generator=g) * std
    return lora


def serve(fast: bool, out_json: str, adapter_dir: str) -> None:
    """Start one engine (fast or stock kernels), generate the fixed requests, write texts as JSON."""
    sys.path.insert(0, str(REPO))
    from transformers import AutoConfig

    from engine.adapters import write_adapter
    from engine.backends import AdapterRef, Sampling
    from engine.backends.vllm_local import VLLMBackend
    from engine.model import resolve_model_path

    model = resolve_model_path("embedded:smollm2-135m-instruct")
    cfg = AutoConfig.from_pretrained(model)
    refs = []
    for k in range(N_ADAPTERS):
        path = write_adapter(Path(adapter_dir) / f"a{k}", _random_lora(cfg, seed=k), 8, 16.0, model)
        refs.append(AdapterRef(f"a{k}", 100 + k, str(path)))
    # max_loras = P + 1 leaves the last slot empty, so vLLM 0.32's stock ops (which apply the last
    # slot to no-adapter tokens) and the fast ops agree on the base-model requests too.
    eng = VLLMBackend(model, max_loras=N_ADAPTERS + 1, kv_cache_gib=1, fast_lora=fast, max_num_seqs=64)
    try:
        questions = [json.loads(line)["question"] for line in GSM8K.open()][:N_PROMPTS]
        prompts = [eng.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                     add_generation_prompt=True) for q in questions]
        adapters = [a for a in [None, *refs] for _ in prompts]
        outs = eng.generate(prompts * (N_ADAPTERS + 1), adapters, Sampling(max_tokens=MAX_TOKENS), use_tqdm=False)
        Path(out_json).write_text(json.dumps([o[0].text for o in outs]))
    finally:
        eng.close()


def _run(fast: bool, tmp_path: Path) -> tuple[list[str], str]:
    out = tmp_path / f"texts_{int(fast)}.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, __file__, "1" if fast else "0", str(out), str(tmp_path / f"ad{int(fast)}")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    return json.loads(out.read_text()), log


@pytest.mark.integration
@pytest.mark.timeout(1800)
def test_fast_path_matches_stock_greedy(tmp_path, record_property):
    if not GSM8K.exists():
        pytest.skip(f"{GSM8K} missing")
    fast, fast_log = _run(True, tmp_path)
    stock, stock_log = _run(False, tmp_path)
    assert "Using FastPunicaWrapperCPU" in fast_log
    assert "Using PunicaWrapperCPU" in stock_log and "FastPunicaWrapperCPU" not in stock_log

    same = sum(a == b for a, b in zip(fast, stock))
    rate = same / len(fast)
    record_property("greedy_match_rate", rate)
    print(f"\nfast vs stock greedy completions identical: {same}/{len(fast)} ({rate:.0%})")
    assert rate >= 0.9, [(i, a, b) for i, (a, b) in enumerate(zip(fast, stock)) if a != b]

    base = stock[:N_PROMPTS]
    changed = [any(stock[(k + 1) * N_PROMPTS + i] != base[i] for i in range(N_PROMPTS)) for k in range(N_ADAPTERS)]
    assert sum(changed) >= N_ADAPTERS - 1, "the random adapters do not change the output: the test is vacuous"


if __name__ == "__main__":
    serve(sys.argv[1] == "1", sys.argv[2], sys.argv[3])
