"""Greedy completions of a population: fast CPU LoRA kernels vs vLLM's stock kernels.

Real engine, default model, real GSM8K prompts. vLLM runs the LoRA ops in a worker process that
reads ``ESSA_FAST_LORA`` when it starts, so each engine runs in its own subprocess (this file run
as a script), one after the other: 4 adapters x 4 prompts plus the same prompts on the base model,
32 greedy tokens, with the top-2 log-probabilities of every step.

What "match" means: the model's logits are bf16, so two candidate tokens often have exactly equal
logits (one bf16 step is 0.0625 at logit 8-16). The fast and the stock kernels round a few of the
LoRA intermediates differently (about 5e-5 of them; neither is closer to an fp64 computation), and
at such a tie that is enough to pick the other token. Measured: 15 of 20 completions identical,
and each of the other 5 diverged at a step where one path's top-2 logits were exactly equal and the
other's one bf16 step apart. So the test requires every completion to be identical up to its end
or up to a tie (top-2 gap <= 2 bf16 steps in both paths, the same two tokens), reports the share
of fully identical completions, and checks that the adapters change the output at all (otherwise
the comparison would be vacuous).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GSM8K = Path(os.environ.get("ESSA_DATA", REPO.parent / "shared" / "data")) / "gsm8k" / "test.jsonl"
N_ADAPTERS, N_PROMPTS, MAX_TOKENS = 4, 4, 32


def serve(fast: bool, out_json: str, adapter_dir: str) -> None:
    """Start one engine (fast or stock kernels), generate the fixed requests, write texts as JSON."""
    sys.path.insert(0, str(REPO))
    from transformers import AutoConfig

    from engine.lora.files import write_adapter
    from engine.backends import AdapterRef
    from engine.backends.vllm_local import VLLMBackend
    from engine.model import resolve_model_path
    from tests.helpers import random_lora

    model = resolve_model_path("embedded:smollm2-135m-instruct")
    cfg = AutoConfig.from_pretrained(model)
    refs = []
    for k in range(N_ADAPTERS):
        path = write_adapter(Path(adapter_dir) / f"a{k}", random_lora(cfg, seed=k), 8, 16.0, model)
        refs.append(AdapterRef(f"a{k}", 100 + k, str(path)))
    # max_loras = P + 1 leaves the last slot empty, so vLLM 0.32's stock ops (which apply the last
    # slot to no-adapter tokens) and the fast ops agree on the base-model requests too.
    eng = VLLMBackend(model, max_loras=N_ADAPTERS + 1, kv_cache_gib=1, fast_lora=fast, max_num_seqs=64)
    try:
        from vllm import SamplingParams
        from vllm.lora.request import LoRARequest

        questions = [json.loads(line)["question"] for line in GSM8K.open()][:N_PROMPTS]
        prompts = [eng.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                     add_generation_prompt=True) for q in questions]
        adapters = [a for a in [None, *refs] for _ in prompts]
        loras = [None if a is None else LoRARequest(a.name, a.lora_int_id, a.path) for a in adapters]
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=2)
        outs = eng.llm.generate(prompts * (N_ADAPTERS + 1), params, lora_request=loras, use_tqdm=False)
        rows = []
        for o in outs:
            c = o.outputs[0]
            # per step: {token id: logprob} of the two most likely tokens (plus the chosen one)
            top = [{int(k): float(v.logprob) for k, v in step.items()} for step in c.logprobs]
            rows.append({"text": c.text, "tokens": list(c.token_ids), "top": top})
        Path(out_json).write_text(json.dumps(rows))
    finally:
        eng.close()


def _run(fast: bool, tmp_path: Path) -> tuple[list[str], str]:
    out = tmp_path / f"texts_{int(fast)}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, __file__, "1" if fast else "0", str(out), str(tmp_path / f"ad{int(fast)}")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    rows = json.loads(out.read_text())
    for r in rows:  # JSON object keys are strings: back to token ids
        r["top"] = [{int(k): v for k, v in step.items()} for step in r["top"]]
    return rows, log


TIE = 0.25  # two bf16 logit steps at |logit| in [16, 32)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, None when the token lists are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def gap(top: dict) -> float:
    """Log-probability gap between the two most likely tokens of one step."""
    v = sorted(top.values(), reverse=True)
    return v[0] - v[1] if len(v) > 1 else float("inf")


@pytest.mark.integration
@pytest.mark.timeout(1800)
def test_fast_path_matches_stock_greedy(tmp_path, record_property):
    if not GSM8K.exists():
        pytest.skip(f"{GSM8K} missing")
    fast, fast_log = _run(True, tmp_path)
    stock, stock_log = _run(False, tmp_path)
    # which wrapper served each run, from vLLM's own INFO line; on some machines (the CI run of
    # 2026-12-01) vLLM's worker log does not reach the captured output at all, then only the
    # numerical comparison below speaks
    if "PunicaWrapperCPU" in fast_log + stock_log:
        assert "Using FastPunicaWrapperCPU" in fast_log
        assert "Using PunicaWrapperCPU" in stock_log and "FastPunicaWrapperCPU" not in stock_log

    identical, not_ties = 0, []
    for i, (f, s) in enumerate(zip(fast, stock)):
        k = first_divergence(f["tokens"], s["tokens"])
        if k is None:
            identical += 1
            continue
        tie = (k < len(f["top"]) and k < len(s["top"]) and set(f["top"][k]) >= {f["tokens"][k], s["tokens"][k]}
               and gap(f["top"][k]) <= TIE and gap(s["top"][k]) <= TIE)
        if not tie:
            not_ties.append((i, k, f["top"][k] if k < len(f["top"]) else None, s["top"][k] if k < len(s["top"]) else None))
    rate = identical / len(fast)
    record_property("greedy_identical_rate", rate)
    print(f"\nfast vs stock: {identical}/{len(fast)} greedy completions identical ({rate:.0%}); "
          f"the other {len(fast) - identical - len(not_ties)} diverge at bf16 logit ties")
    assert not not_ties, f"completions diverging where the logits are not tied: {not_ties}"
    assert rate >= 0.5, "most completions should not even meet a tie within 32 tokens"

    base = [r["text"] for r in stock[:N_PROMPTS]]
    changed = [any(stock[(k + 1) * N_PROMPTS + i]["text"] != base[i] for i in range(N_PROMPTS)) for k in range(N_ADAPTERS)]
    assert sum(changed) >= N_ADAPTERS - 1, "the random adapters do not change the output: the test is vacuous"


if __name__ == "__main__":
    serve(sys.argv[1] == "1", sys.argv[2], sys.argv[3])
