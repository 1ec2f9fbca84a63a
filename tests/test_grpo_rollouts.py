"""GRPO rollouts through ``rollout_func`` (engine/commands/grpo/rollouts.py) with TRL's real GRPOTrainer.

A tiny random Llama (the default model's tokenizer) trains for a few optimiser steps; a small fake
back-end stands in for vLLM (the real engine runs in tests/test_grpo.py::test_tiny_real_run): it
records the adapter files it is asked to serve and returns random token ids and logprobs.
"""

import numpy as np
import pytest
import torch

from engine.backends import Completion, lora_int_id

pytest.importorskip("trl")

RANK, ALPHA = 8, 16.0
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


class FakeBackend:
    """Records each call's adapter (tensors read from disk at call time) and returns random rollouts."""

    def __init__(self, tokenizer, seed: int = 0):
        self.tokenizer, self.rng = tokenizer, np.random.default_rng(seed)
        self.calls: list[dict] = []

    def generate(self, prompts, adapters, sampling, use_tqdm=True):
        from engine.lora.files import read_adapter

        assert sampling.logprobs and sampling.n == 1 and len(set(adapters)) == 1
        lora, _ = read_adapter(adapters[0].path)
        self.calls.append({"ref": adapters[0], "lora": lora, "sampling": sampling, "n": len(prompts)})
        outs = []
        for p in prompts:
            length = int(self.rng.integers(1, sampling.max_tokens + 1))
            ids = self.rng.integers(10, 1000, size=length).tolist()
            lps = (-self.rng.exponential(1.0, size=length)).tolist()
            prompt_ids = self.tokenizer(p, add_special_tokens=False)["input_ids"]
            outs.append([Completion(self.tokenizer.decode(ids), length, ids, lps, prompt_ids)])
        return outs


def odd_length_reward(completions, completion_ids, **kwargs):
    """1 for an odd number of completion tokens, else 0: varied rewards, so advantages are non-zero."""
    return [float(len(ids) % 2) for ids in completion_ids]


def tiny_trainer(tmp_path, focal_gamma: float = 0.0, max_steps: int = 3, seed: int = 0):
    """(trainer, fake backend, publisher) for a 2-layer random Llama with a rank-8 LoRA policy."""
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig

    from engine.grpo.focal import focal_trainer_class
    from engine.grpo.rollouts import AdapterPublisher, VLLMRollouts
    from engine.model import resolve_model_path
    from engine.prompts import chat_messages

    model_path = resolve_model_path("embedded:smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    torch.manual_seed(seed)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id))
    model = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=list(TARGETS),
                                            init_lora_weights="gaussian"))
    backend = FakeBackend(tokenizer, seed)
    publisher = AdapterPublisher(RANK, ALPHA, TARGETS, model_path, root=tmp_path / "adapters")
    rollouts = VLLMRollouts(backend, publisher, tokenizer, max_tokens=8, temperature=1.0, top_p=1.0, seed=seed,
                            log_dir=tmp_path / "rollouts")
    args = GRPOConfig(output_dir=str(tmp_path / "trainer"), max_steps=max_steps, per_device_train_batch_size=8,
                      num_generations=4, learning_rate=1e-2, lr_scheduler_type="constant",
                      max_completion_length=8, temperature=1.0, beta=0.0, num_iterations=1, use_vllm=False,
                      vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_truncate",
                      vllm_importance_sampling_clip_max=2.0, logging_steps=1, save_strategy="no", report_to=[],
                      seed=seed, use_cpu=True, disable_tqdm=True)
    rows = [{"prompt": chat_messages(f"What is {i} + {i}?", "Box the answer."), "answer": str(2 * i)}
            for i in range(16)]
    trainer = focal_trainer_class()(model=model, reward_funcs=[odd_length_reward], args=args,
                                    train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                                    focal_gamma=focal_gamma, vllm_rollouts=rollouts)
    return trainer, backend, publisher


def lora_after_each_step(trainer) -> list[dict]:
    """LoRA state before training, then after every optimiser step (a callback appends copies)."""
    from transformers import TrainerCallback

    from engine.grpo.rollouts import lora_state

    states = [{k: v.clone().float() for k, v in lora_state(trainer.model).items()}]

    class Keep(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            states.append({k: v.clone().float() for k, v in lora_state(model).items()})

    trainer.add_callback(Keep())
    return states


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Three optimiser steps of the tiny trainer; the LoRA state before and after each step."""
    tmp = tmp_path_factory.mktemp("grpo_rollouts")
    trainer, backend, publisher = tiny_trainer(tmp, max_steps=3)
    trained = lora_after_each_step(trainer)
    trainer.train()
    publisher.close()
    return {"trainer": trainer, "backend": backend, "publisher": publisher, "trained": trained, "dir": tmp}


def test_served_adapter_is_the_policy_after_the_previous_step(run):
    backend, trained = run["backend"], run["trained"]
    assert len(backend.calls) == 3 and len(trained) == 4
    for k, call in enumerate(backend.calls):          # rollouts of step k + 1 come from the policy after step k
        assert call["ref"].lora_int_id == lora_int_id(k, 0)
        assert call["n"] == 8                          # 2 prompts x 4 rollouts, one request each
        assert call["lora"].keys() == trained[k].keys() and len(call["lora"]) == 2 * 4 * 2
        for name, t in trained[k].items():
            assert torch.equal(call["lora"][name], t), (k, name)
        if k:  # the policy moved, so a stale adapter would fail the equality above
            assert any(not torch.equal(trained[k][n], trained[k - 1][n]) for n in trained[k])
    assert len({c["sampling"].seed for c in backend.calls}) == 3   # a fresh sampling stream per step
    assert not run["publisher"].root.exists()


def test_rollout_log_and_trl_importance_sampling(run):
    import pyarrow.parquet as pq

    rows = [r for f in sorted((run["dir"] / "rollouts").glob("step_*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert [r["step"] for r in rows] == [0] * 8 + [1] * 8 + [2] * 8
    assert {r["adapter_id"] for r in rows if r["step"] == 1} == {lora_int_id(1, 0)}
    for r in rows:  # the ids and logprobs TRL receives line up token for token
        assert len(r["completion_ids"]) == len(r["logprobs"]) == r["n_tokens"] >= 1
    logs = [h for h in run["trainer"].state.log_history if "loss" in h]
    assert len(logs) == 3
    for h in logs:  # TRL's vLLM importance-sampling path ran on our rollouts, capped at C = 2
        assert 0 < h["sampling/importance_sampling_ratio/mean"] <= 2.0
        assert h["sampling/sampling_logp_difference/mean"] > 0
        assert h["rollouts/count"] == 8 and h["rollouts/generate_s"] > 0


def test_publisher_ids_and_files(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.lora.files import read_adapter
    from engine.grpo.rollouts import AdapterPublisher

    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1))
    model = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=list(TARGETS)))
    pub = AdapterPublisher(RANK, ALPHA, TARGETS, "base", root=tmp_path)
    a = pub.publish(model, 0)
    assert pub.publish(model, 0) is a                              # once per step
    lora, cfg = read_adapter(a.path)
    assert cfg["r"] == RANK and cfg["lora_alpha"] == ALPHA and cfg["base_model_name_or_path"] == "base"
    b = pub.publish(model, 1)
    assert (a.lora_int_id, b.lora_int_id) == (lora_int_id(0, 0), lora_int_id(1, 0))
    assert not (tmp_path / a.path).exists() and (tmp_path / b.path).exists()   # only the latest stays
    with pytest.raises(ValueError, match="never reused"):
        pub.publish(model, 0)
    pub.close()
    assert not pub.root.exists()


def test_vllm_output_to_completion():
    """engine.backends.vllm_local._with_logprobs on vLLM 0.32's output types (logprobs=0: the sampled token)."""
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput

    from engine.backends.vllm_local import _with_logprobs

    lps = [{5: Logprob(-0.5, 1)}, {7: Logprob(float("nan"), 1)}, {2: Logprob(-1.25, 1)}]
    out = CompletionOutput(index=0, text="a b", token_ids=[5, 7, 2], cumulative_logprob=None, logprobs=lps)
    c = _with_logprobs(out, [1, 2, 3])
    assert (c.text, c.n_tokens, c.token_ids, c.prompt_token_ids) == ("a b", 3, [5, 7, 2], [1, 2, 3])
    assert c.logprobs == [-0.5, None, -1.25]                       # NaN -> None, as TRL expects
    short = CompletionOutput(index=0, text="a", token_ids=[5, 7], cumulative_logprob=None, logprobs=lps[:1])
    with pytest.raises(RuntimeError, match="1 logprobs for 2 tokens"):
        _with_logprobs(short, [1])
