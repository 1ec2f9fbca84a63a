"""``essa eval`` (engine/commands/eval.py): a fast test with a scripted back-end, and the real thing
(vLLM on CPU, the default model, four GSM8K test rows from ../shared/data) through the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir

from engine.backends import Completion
from engine.commands import register_configs
from engine.config import ConfigError
from engine.commands.eval import resolve_conditions, run_eval

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"


def compose_eval(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("eval", overrides=overrides)


def write_random_adapter(path: Path, model_path: str, rank: int = 8, seed: int = 0) -> Path:
    """A small random PEFT LoRA (q, k, v, o of every layer) with shapes from the model's config.json."""
    import torch

    from engine.lora.files import write_adapter

    cfg = json.loads((Path(model_path) / "config.json").read_text())
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv, hd = cfg.get("num_key_value_heads", heads), cfg.get("head_dim") or cfg["hidden_size"] // heads
    shapes = {"q_proj": (h, heads * hd), "k_proj": (h, kv * hd), "v_proj": (h, kv * hd), "o_proj": (heads * hd, h)}
    g = torch.Generator().manual_seed(seed)
    lora = {}
    for layer in range(cfg["num_hidden_layers"]):
        for m, (d_in, d_out) in shapes.items():
            key = f"base_model.model.model.layers.{layer}.self_attn.{m}"
            lora[f"{key}.lora_A.weight"] = torch.randn(rank, d_in, generator=g) / d_in ** 0.5   # (r, in)
            lora[f"{key}.lora_B.weight"] = 0.02 * torch.randn(d_out, rank, generator=g)        # (out, r)
    return write_adapter(path, lora, rank, 16.0, model_path)


class ChatTokenizer:
    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "\n".join(f"<{m['role']}>{m['content']}" for m in messages) + "\n<assistant>"


class ScriptedBackend:
    """Base model: always wrong. Adapter: greedy right; sample g right when g < 2 (2 of n correct)."""

    tokenizer = ChatTokenizer()

    def __init__(self, answers: dict[str, str]):
        self.answers, self.calls = answers, []

    def generate(self, prompts, adapters, sampling, use_tqdm=True):
        self.calls.append((len(prompts), len({a.lora_int_id if a else None for a in adapters}), sampling.n))
        out = []
        for p, a in zip(prompts, adapters):
            ans = next(v for q, v in self.answers.items() if q in p)
            if a is None:
                texts = ["I think \\boxed{-1}"] * sampling.n
            elif sampling.temperature == 0:
                texts = [f"so \\boxed{{{ans}}}"]
            else:
                texts = [f"\\boxed{{{ans}}}" if g < 2 else "no idea" for g in range(sampling.n)]
            out.append([Completion(t, 7) for t in texts])
        return out


def test_eval_with_scripted_backend(tmp_path):
    from engine.tasks import load_task

    adapter = tmp_path / "my_adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}))
    cfg = compose_eval(["task.val_size=5", "n=4", "ks=[1,2,4]", f"adapters=[{adapter}]", "max_tokens=8"])
    task = load_task(cfg.task)
    backend = ScriptedBackend({p.question: p.answer for p in task.val})
    summary = run_eval(cfg, tmp_path / "out", backend=backend)

    assert backend.calls == [(10, 2, 1), (10, 2, 4)]          # one batch per pass, both conditions in it
    base, ad = summary["conditions"]["no_adapter"], summary["conditions"]["my_adapter"]
    assert base["greedy_accuracy"] == 0.0 and base["pass_at_k"] == {"1": 0.0, "2": 0.0, "4": 0.0}
    assert ad["greedy_accuracy"] == 1.0 and ad["avg_at_n"] == 0.5
    # 2 of 4 correct: pass@1 = 1/2, pass@2 = 1 - C(2,2)/C(4,2) = 5/6, pass@4 = 1
    assert ad["pass_at_k"] == pytest.approx({"1": 0.5, "2": 5 / 6, "4": 1.0})
    rows = pq.read_table(tmp_path / "out" / "eval_problems.parquet").to_pylist()
    assert len(rows) == 10 and {r["condition"] for r in rows} == {"no_adapter", "my_adapter"}
    r = next(r for r in rows if r["condition"] == "my_adapter")
    assert (r["n"], r["n_correct"], r["greedy_correct"]) == (4, 2, True)
    assert r["statuses"] == ["correct", "correct", "no_answer", "no_answer"]
    saved = json.loads((tmp_path / "out" / "eval_summary.json").read_text())
    assert saved["ks"] == [1, 2, 4] and saved["n_problems"] == 5


class UnmarkedBackend(ScriptedBackend):
    """Base model: the right number, unmarked. Adapter: the right number boxed, then a run-on question."""

    def generate(self, prompts, adapters, sampling, use_tqdm=True):
        out = []
        for p, a in zip(prompts, adapters):
            ans = next(v for q, v in self.answers.items() if q in p)
            text = (f"So she pays 9 * 2 = ${ans} in all." if a is None
                    else f"So \\boxed{{{ans}}}.\nQuestion: Tom has 3 pens and buys 4. How many?\nAnswer: 7")
            out.append([Completion(text, 9)] * sampling.n)
        return out


def test_eval_strict_and_flexible_accuracy(tmp_path, capsys):
    from engine.tasks import load_task

    adapter = tmp_path / "boxer"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}))
    cfg = compose_eval(["task.val_size=4", "n=2", "ks=[1,2]", f"adapters=[{adapter}]", "max_tokens=8"])
    task = load_task(cfg.task)
    summary = run_eval(cfg, tmp_path / "out", backend=UnmarkedBackend({p.question: p.answer for p in task.val}))
    base, boxer = summary["conditions"]["no_adapter"], summary["conditions"]["boxer"]
    # strict = the training reward (answer marker required); flexible = marker, else the last number
    assert (base["greedy_accuracy"], base["greedy_accuracy_flexible"]) == (0.0, 1.0)
    assert (base["avg_at_n"], base["avg_at_n_flexible"]) == (0.0, 1.0)
    assert (boxer["greedy_accuracy"], boxer["greedy_accuracy_flexible"]) == (1.0, 1.0)  # run-on "7" not taken
    assert "flexible" in capsys.readouterr().out
    rows = pq.read_table(tmp_path / "out" / "eval_problems.parquet").to_pylist()
    r = next(r for r in rows if r["condition"] == "no_adapter")
    assert (r["greedy_correct"], r["greedy_status"], r["greedy_flexible_correct"]) == (False, "no_answer", True)
    assert r["greedy_flexible_extracted"] == r["reference"] and (r["n_correct"], r["n_correct_flexible"]) == (0, 2)


def test_conditions_and_config_errors(tmp_path):
    run = tmp_path / "run"
    for name in ("mean", "best"):
        (run / "adapters" / name).mkdir(parents=True)
        (run / "adapters" / name / "adapter_config.json").write_text("{}")
    assert list(resolve_conditions(str(run))) == ["no_adapter", "mean", "best"]
    assert list(resolve_conditions([str(run), str(run / "adapters" / "mean")], include_base=False)) == \
        ["run/mean", "run/best", "mean"]
    assert list(resolve_conditions("none")) == ["no_adapter"]
    with pytest.raises(FileNotFoundError, match="neither a PEFT adapter"):
        resolve_conditions([str(tmp_path / "missing")])
    with pytest.raises(ConfigError, match="include_base=true"):
        resolve_conditions([], include_base=False)
    for bad, msg in ((["n=4", "ks=[8]"], "ks="), (["n=4", "temperature=0"], "identical samples"),
                     (["split=test"], "split="), (["top_p=2"], "top_p=2"), (["temperature=-1"], "temperature=-1")):
        with pytest.raises(ConfigError, match=msg):
            run_eval(compose_eval(bad), tmp_path / "x", backend=ScriptedBackend({}))


class DiceBackend(ScriptedBackend):
    """vLLM's seeded sampling in miniature: sample g of a request with seed s draws u from
    ``default_rng(s + g)`` (vllm/v1/engine/parallel_sampling.py gives child g the seed s + g) and a
    condition answers right when u < its skill, so two conditions with the same skill give the same
    answers exactly when they get the same seeds. Records the request seeds of every call."""

    SKILL = {None: 0.2, "twin_a": 0.5, "twin_b": 0.5, "better": 0.8}

    def __init__(self, answers):
        super().__init__(answers)
        self.seeds = []

    def generate(self, prompts, adapters, sampling, use_tqdm=True):
        seeds = sampling.request_seeds(prompts, adapters)
        self.seeds.append(seeds)
        out = []
        for p, a, seed in zip(prompts, adapters, seeds):
            ans, skill = next(v for q, v in self.answers.items() if q in p), self.SKILL[a and Path(a.path).name]
            us = [0.0] if seed is None else [np.random.default_rng(seed + g).random() for g in range(sampling.n)]
            out.append([Completion(f"\\boxed{{{ans}}}" if u < skill else "\\boxed{-1}", 5) for u in us])
        return out


def _adapters(tmp_path, names):
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16,
                                                                          "target_modules": ["q_proj"]}))
    return "[" + ",".join(str(tmp_path / n) for n in names) + "]"


def test_pass_at_k_study_common_seeds_and_paired_differences(tmp_path, capsys):
    """issue 44: every condition samples problem i with the same seeds, so identical adapters differ by
    exactly 0; each condition gets its difference against the control (default: the first adapter) with a
    paired bootstrap interval, and the others are compared pairwise."""
    from engine.tasks import load_task

    cfg = compose_eval(["task.val_size=30", "n=8", "ks=[1,2,8]", "max_tokens=8",
                        f"adapters={_adapters(tmp_path, ['twin_a', 'twin_b', 'better'])}"])
    backend = DiceBackend({p.question: p.answer for p in load_task(cfg.task).val})
    summary = run_eval(cfg, tmp_path / "out", backend=backend)

    greedy_seeds, sampled_seeds = backend.seeds
    assert greedy_seeds == [None] * 120                                   # temperature 0 draws nothing
    seeds = np.array(sampled_seeds).reshape(4, 30)                        # (A conditions, N problems)
    assert np.all(seeds == seeds[0]) and len(set(seeds[0])) == 30         # same per problem, distinct across

    conds = summary["conditions"]
    assert summary["control"] == "twin_a" and "pass_at_k_vs_control" not in conds["twin_a"]
    twin = conds["twin_b"]["pass_at_k_vs_control"]
    assert twin == {k: {"diff": 0.0, "low": 0.0, "high": 0.0, "sd": 0.0, "problems": 30} for k in ("1", "2", "8")}
    better, base = conds["better"]["pass_at_k_vs_control"], conds["no_adapter"]["pass_at_k_vs_control"]
    assert better["1"]["low"] > 0.0 and all(better[k]["diff"] >= 0.0 for k in better)   # same dice, more skill
    assert base["1"]["high"] < 0.0
    assert better["1"]["diff"] == pytest.approx(conds["better"]["pass_at_k"]["1"] - conds["twin_a"]["pass_at_k"]["1"])
    assert [(p["condition"], p["against"]) for p in summary["pass_at_k_pairs"]] == \
        [("no_adapter", "twin_b"), ("no_adapter", "better"), ("twin_b", "better")]
    for row in conds.values():                                           # each mean inside its own interval
        for k, (lo, hi) in row["pass_at_k_ci95"].items():
            assert lo <= row["pass_at_k"][k] <= hi
    assert summary["bootstrap"]["resamples"] == 2000
    saved = json.loads((tmp_path / "out" / "eval_summary.json").read_text())
    assert saved["conditions"]["twin_b"]["pass_at_k_vs_control"]["8"]["problems"] == 30
    out = capsys.readouterr().out
    assert "pass@k differences" in out and "twin_b - twin_a" in out and "twin_b - better" in out
    assert "+0.000 [+0.000, +0.000]" in out

    cfg = compose_eval(["task.val_size=30", "n=8", "ks=[1,8]", "max_tokens=8", "control=no_adapter",
                        f"adapters=[{tmp_path / 'twin_a'},{tmp_path / 'better'}]"])
    backend = DiceBackend({p.question: p.answer for p in load_task(cfg.task).val})
    summary = run_eval(cfg, tmp_path / "out2", backend=backend)
    assert summary["control"] == "no_adapter" and summary["conditions"]["better"]["pass_at_k_vs_control"]["1"]["low"] > 0
    assert [(p["condition"], p["against"]) for p in summary["pass_at_k_pairs"]] == [("twin_a", "better")]


def test_control_names_a_condition(tmp_path):
    from engine.commands.eval_config import resolve_control

    assert resolve_control(None, ["no_adapter", "sft", "mean"]) == "sft"       # the first adapter
    assert resolve_control(None, ["no_adapter"]) == "no_adapter"
    assert resolve_control(None, ["run/mean", "run/best"]) == "run/mean"
    assert resolve_control("mean", ["no_adapter", "sft", "mean"]) == "mean"
    cfg = compose_eval(["n=4", "control=sft", f"adapters={_adapters(tmp_path, ['warm', 'trained'])}"])
    backend = ScriptedBackend({})
    with pytest.raises(ConfigError) as e:
        run_eval(cfg, tmp_path / "x", backend=backend)
    msg = str(e.value)
    assert msg.startswith("control='sft' is not an evaluated condition; available: no_adapter, warm, trained")
    assert "\n" not in msg and backend.calls == []                       # refused before any generation


@pytest.mark.integration
def test_essa_eval_on_gsm8k_rows(tmp_path):
    """Four real GSM8K test rows, base model + a random LoRA adapter, through the essa CLI."""
    from engine.model import resolve_model_path

    if not (REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl").exists() and "ESSA_DATA" not in os.environ:
        pytest.skip("GSM8K data not found (../shared/data/gsm8k)")
    model_path = resolve_model_path("embedded:smollm2-135m-instruct")
    adapter = write_random_adapter(tmp_path / "sft_like", model_path)
    out = tmp_path / "eval_out"
    args = ["eval", "task=gsm8k", "task.val_size=4", f"adapters=[{adapter}]", "n=4", "temperature=1.0",
            "ks=[1,2,4]", "max_tokens=32", "engine.kv_cache_gib=1", "engine.max_num_seqs=64",
            f"hydra.run.dir={out}"]
    essa = str(Path(sys.executable).parent / "essa")  # the console script users run
    res = subprocess.run([essa, *args], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "pass@4" in res.stdout                                    # the printed table

    summary = json.loads((out / "eval_summary.json").read_text())
    assert set(summary["conditions"]) == {"no_adapter", "sft_like"}
    assert summary["n_problems"] == 4 and summary["ks"] == [1, 2, 4]
    for cond in summary["conditions"].values():
        vals = [cond["greedy_accuracy"], cond["avg_at_n"], *cond["pass_at_k"].values()]
        assert all(0.0 <= v <= 1.0 for v in vals), cond
        pk = [cond["pass_at_k"][k] for k in ("1", "2", "4")]
        assert pk == sorted(pk) and pk[0] == pytest.approx(cond["avg_at_n"])
        assert all(lo <= cond["pass_at_k"][k] <= hi for k, (lo, hi) in cond["pass_at_k_ci95"].items())
    # issue 44: the base model against the control (the adapter, the first one), paired over the 4 problems
    assert summary["control"] == "sft_like" and summary["pass_at_k_pairs"] == []
    vs = summary["conditions"]["no_adapter"]["pass_at_k_vs_control"]
    assert set(vs) == {"1", "2", "4"}
    assert all(d["problems"] <= 4 and (d["diff"] is None or d["low"] <= d["diff"] <= d["high"]) for d in vs.values())
    assert "pass@k differences" in res.stdout
    rows = pq.read_table(out / "eval_problems.parquet").to_pylist()
    assert len(rows) == 8
    assert all(r["problem_id"].startswith("gsm8k/test/") and r["n"] + r["n_error"] == 4 for r in rows)
    assert all(0 <= r["n_correct"] <= r["n"] and len(r["statuses"]) == 4 for r in rows)
    assert (out / ".hydra" / "config.yaml").exists()
    assert np.isfinite(summary["tokens_per_s"]) and summary["tokens"] > 0


def test_adapter_rank_names_a_bad_adapter_config(tmp_path):
    from engine.lora.checks import adapter_rank

    a = tmp_path / "adapter"
    a.mkdir()
    f = a / "adapter_config.json"
    f.write_text(json.dumps({"r": 16, "lora_alpha": 32, "target_modules": ["q_proj"]}))
    assert adapter_rank(a) == 16
    for text, msg in (("{r: 8,", "not valid JSON"),
                      (json.dumps({"lora_alpha": 32}), 'no positive integer LoRA rank "r"'),
                      (json.dumps({"r": "eight"}), 'LoRA rank "r"'), ("[8]", 'LoRA rank "r"'),
                      # vLLM's PEFTHelper needs both; without them the engine died after start-up (break-it)
                      (json.dumps({"r": 8}), "no lora_alpha or target_modules"),
                      (json.dumps({"r": 8, "lora_alpha": 16}), "no target_modules")):
        f.write_text(text)
        with pytest.raises(ValueError, match=msg) as e:
            adapter_rank(a)
        assert str(f) in str(e.value) and "adapters" in str(e.value) and "\n" not in str(e.value)


def _pass(statuses: list[list[str]]):
    """A PassResult for one condition from per-problem status lists (N problems x G samples)."""
    from engine.evaluation.passes import PassResult

    st = np.array([statuses], dtype=object)                       # (1, N, G)
    none = np.full(st.shape, None, dtype=object)
    return PassResult(correct=st == "correct", scored=st != "error", extracted=none, status=st,
                      n_tokens=np.ones(st.shape, dtype=np.int64), texts=none, generate_s=1.0)


def test_summary_pass_at_k_one_problem_set_and_positive_zero():
    from engine.commands.eval import format_table, summarise
    from engine.results.report import _fmt

    # issue 16: A (n 4, c 0), B (2 of 4 unscorable, c 2) gave pass@1 0.5, pass@2 0.5, pass@4 0.0
    greedy = _pass([["wrong"], ["correct"]])
    sampled = _pass([["wrong"] * 4, ["error", "error", "correct", "correct"]])
    row = summarise(greedy, sampled, [1, 2, 4], ["c"])["c"]
    vals = [row["pass_at_k"][k] for k in ("1", "2", "4")]
    assert all(b >= a for a, b in zip(vals, vals[1:])), vals     # never falls as k grows
    assert vals == [0.0, 0.0, 0.0]                               # over {A}: B has 2 < max(ks) scorable samples
    assert row["pass_at_k_problems"] == {"1": 1, "2": 1, "4": 1} and row["pass_at_k_excluded"] == 1
    # zero is +0.0 when stored and printed (it was -0.0 / -0.000)
    assert all(np.copysign(1.0, v) == 1.0 for v in vals)
    assert "-0.0" not in json.dumps(row)
    table = format_table({"c": row}, 4, [1, 2, 4], "t")
    assert "0.000" in table and "-0.000" not in table
    assert _fmt(-0.0) == "0.000"                                 # summaries written before the fix
    # with every problem fully scorable the set is all problems and the values are the usual ones
    row = summarise(_pass([["wrong"], ["correct"]]), _pass([["wrong"] * 4, ["wrong", "wrong", "correct", "correct"]]),
                    [1, 2, 4], ["c"])["c"]
    assert row["pass_at_k"] == pytest.approx({"1": 0.25, "2": 5 / 12, "4": 0.5})
    assert row["pass_at_k_excluded"] == 0


SERVED = [
    ({}, 8),                                                           # plain LoRA: r
    ({"rank_pattern": {"q_proj": 32, "v_proj": 16}}, 32),              # per-module ranks above r: the largest
    ({"rank_pattern": {}, "alpha_pattern": {"o_proj": 64}}, 8),        # served by vLLM (per-module scaling)
    ({"use_rslora": True}, 8),                                         # served (scaling alpha / sqrt(r))
    ({"target_modules": r".*\.(q_proj|v_proj)"}, 8),                   # regex string: vLLM reads the weight names
    ({"use_dora": False, "modules_to_save": None, "bias": "none"}, 8),  # PEFT's defaults written out
]


@pytest.mark.parametrize("extra,rank", SERVED)
def test_adapter_rank_serves_peft_features(tmp_path, extra, rank):
    from engine.lora.checks import adapter_rank

    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], **extra}))
    assert adapter_rank(tmp_path) == rank


REFUSED = [
    ({"use_dora": True}, "use_dora"),                                  # DoRA: vLLM has no DoRA layers
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),             # whole trained modules
    ({"bias": "lora_only"}, "bias"),                                   # trained biases
    ({"bias": "all"}, "bias"),
    ({"lora_bias": True}, "lora_bias"),
    ({"rank_pattern": {"q_proj": 0}}, "rank_pattern"),                 # not a positive rank
    ({"rank_pattern": ["q_proj"]}, "rank_pattern"),                    # not a dict
    ({"alpha_pattern": {"q_proj": "big"}}, "alpha_pattern"),
    ({"target_modules": "(q_proj"}, "target_modules"),                 # not a valid regex
]


@pytest.mark.parametrize("extra,field", REFUSED)
def test_adapter_rank_refuses_unserved_peft_features_in_one_line(tmp_path, extra, field):
    from engine.lora.checks import adapter_rank

    f = tmp_path / "adapter_config.json"
    f.write_text(json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], **extra}))
    with pytest.raises(ValueError) as e:
        adapter_rank(tmp_path)
    msg = str(e.value)
    assert field in msg and str(f) in msg and msg.startswith("adapters:") and "\n" not in msg


def test_eval_engine_rank_covers_rank_pattern(tmp_path):
    # issue 16: adapter_rank read only r, so an adapter with rank_pattern got too small a max_lora_rank
    import engine.commands.eval as ev

    adapter = tmp_path / "third_party"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "rank_pattern": {"q_proj": 64}}))
    _write_weights(adapter, 64)
    built = {}

    def fake_build_backend(cfg, model_path, n_adapters, rank):
        built["rank"] = rank
        raise RuntimeError("stop before starting an engine")

    cfg = compose_eval(["task.val_size=2", f"adapters=[{adapter}]"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ev, "build_backend", fake_build_backend)
        mp.setattr("engine.model.resolve_model_path", lambda path, *args, **kwargs: str(path))
        with pytest.raises(RuntimeError, match="stop before"):
            run_eval(cfg, tmp_path / "out")
    assert built["rank"] == 64
    with pytest.raises(ConfigError, match="lora_rank=16 is below the largest adapter rank 64"):
        run_eval(compose_eval(["task.val_size=2", f"adapters=[{adapter}]", "lora_rank=16"]), tmp_path / "out")


def _write_weights(adapter, rank_a, rank_b=None):
    """A minimal adapter_model.safetensors: one q_proj LoRA pair of ranks ``rank_a`` (A) and ``rank_b`` (B)."""
    import numpy as np
    from safetensors.numpy import save_file

    pre = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file({f"{pre}.lora_A.weight": np.zeros((rank_a, 16), np.float32),
               f"{pre}.lora_B.weight": np.zeros((16, rank_b or rank_a), np.float32)},
              str(adapter / "adapter_model.safetensors"))


def test_eval_refuses_bad_adapter_weights_before_the_engine(tmp_path):
    """essa eval: no adapter_model.safetensors (or only adapter_model.bin), an unreadable one, or a lora_A/lora_B
    rank that disagrees with adapter_config.json's r: one line before the engine starts (break-it finding)."""
    import engine.commands.eval as ev

    adapter = tmp_path / "ad"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}))

    def fake_build_backend(*a, **kw):
        raise RuntimeError("stop before starting an engine")

    def check(msg):
        cfg = compose_eval(["task.val_size=2", f"adapters=[{adapter}]"])
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ev, "build_backend", fake_build_backend)
            mp.setattr("engine.model.resolve_model_path", lambda path, *args, **kwargs: str(path))
            if msg is None:
                with pytest.raises(RuntimeError, match="stop before"):
                    run_eval(cfg, tmp_path / "out")
                return
            with pytest.raises(ValueError, match=msg) as e:
                run_eval(cfg, tmp_path / "out")
        assert str(e.value).startswith("adapters:") and "\n" not in str(e.value)

    check("no adapter_model.safetensors")
    (adapter / "adapter_model.bin").write_bytes(b"pickle")
    check("only adapter_model.bin .*convert it to safetensors")
    (adapter / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage!garbage!")
    check("is not a readable safetensors file")
    _write_weights(adapter, 8, 4)
    check(r"tensor base_model\.model\.model\.layers\.0\.self_attn\.q_proj\.lora_B\.weight has shape \[16, 4\], rank 4.*r=8")
    _write_weights(adapter, 16)
    check(r"lora_A\.weight has shape \[16, 16\], rank 16")
    _write_weights(adapter, 8)
    check(None)  # consistent: on to the engine


def test_adapter_checks_agree_with_vllm(tmp_path):
    # what adapter_rank serves, vLLM 0.32's PEFTHelper accepts with max_lora_rank = adapter_rank (rounded
    # as the engine does), and the features it refuses vLLM refuses too (they would fail or be dropped later)
    from vllm.config.lora import LoRAConfig
    from vllm.lora.peft_helper import PEFTHelper

    from engine.backends.vllm_local import round_lora_rank
    from engine.lora.checks import adapter_rank

    features = [e for e, _ in SERVED] + [e for e, f in REFUSED if f in ("use_dora", "modules_to_save", "bias", "lora_bias")]
    for extra in features:
        conf = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], **extra}
        (tmp_path / "adapter_config.json").write_text(json.dumps(conf))
        try:
            rank, ours = adapter_rank(tmp_path), None
        except ValueError as e:
            rank, ours = 8, str(e)
        try:
            PEFTHelper.from_dict(conf).validate_legal(LoRAConfig(max_lora_rank=round_lora_rank(rank)))
            theirs = None
        except ValueError as e:
            theirs = str(e)
        assert (ours is None) == (theirs is None), (extra, ours, theirs)


def test_a_grpo_run_directory_resolves_to_its_final_adapter(tmp_path):
    # essa grpo exports adapters/final; `essa eval adapters=[<grpo run dir>]` must find it (new-user finding)
    run = tmp_path / "grpo_run"
    (run / "adapters" / "final").mkdir(parents=True)
    (run / "adapters" / "final" / "adapter_config.json").write_text("{}")
    assert list(resolve_conditions(str(run))) == ["no_adapter", "final"]


@pytest.mark.parametrize("overrides, line", [
    (["limit=-1"], "limit=-1: must be >= 0 (0 = every problem of the split), e.g. limit=100"),
    (["max_tokens=0"], "max_tokens=0: must be >= 1 (new tokens per completion), e.g. max_tokens=256"),
])
def test_limit_and_max_tokens_are_named_apart(overrides, line):
    """A negative limit was refused as 'limit must be >= 0 and max_tokens >= 1': no value, both fields (break-it)."""
    from engine.commands.eval_config import validate

    with pytest.raises(ConfigError) as e:
        validate(compose_eval(overrides))
    assert str(e.value) == line


@pytest.mark.parametrize("argv, line", [
    (["control=nope"], "control='nope' is not an evaluated condition; available: no_adapter"),
    (["adapters=[/nonexistent/adapter]"], "adapters: /nonexistent/adapter is neither a PEFT adapter"),
    (["adapters=[]", "include_base=false"], "nothing to evaluate: adapters is empty and include_base=false"),
])
def test_preview_refuses_the_conditions_the_run_refuses(argv, line, capsys):
    """``essa eval ... --cfg job`` printed the config for an unknown control, a missing adapter and an empty
    condition list, which the run refuses before it loads anything (break-it)."""
    from engine.cli import main

    with pytest.raises(SystemExit) as e:
        main(["eval", *argv, "--cfg", "job"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith(f"essa: error: {line}"), err


def test_control_refusal_lists_names_as_they_are_typed(tmp_path):
    """Condition names come from directory names; the refusal lists each as a value Hydra reads back as that
    name (quoted where needed: 'a,b' unquoted is a sweep, 'ü' unquoted does not parse, ${x} interpolates), and
    the quoted form composes to the name."""
    from engine.commands.eval_config import resolve_control

    names = ["no_adapter", "run/mean", "a,b", "ü-ckpt", "it's", "${x}", "null", "my adapter"]
    with pytest.raises(ConfigError) as e:
        resolve_control("nope", names)
    listed = str(e.value).split("available: ", 1)[1].split(" (set control=", 1)[0]
    assert listed == "no_adapter, run/mean, 'a,b', 'ü-ckpt', 'it\\'s', '\\${x}', 'null', my adapter", listed
    for name, typed in zip(names, ["no_adapter", "run/mean", "'a,b'", "'ü-ckpt'", "'it\\'s'", "'\\${x}'", "'null'",
                                   "my adapter"]):
        assert compose_eval([f"control={typed}"]).control == name


def test_diff_table_counts_each_comparisons_own_problems():
    """Each comparison is paired on its own problem set: the printed block gave one 'problems' column, the
    first comparison's, so a row read '-  -  +0.500 [+0.500, +0.500]  0' (0 problems beside a difference on 2;
    break-it: the control scored nothing, the other pair scored both problems)."""
    from engine.commands.eval import compare_passk, format_diff_table
    from engine.evaluation.passes import PassResult

    st = np.array([[["error"] * 2] * 2, [["correct", "wrong"]] * 2, [["wrong", "wrong"]] * 2], dtype=object)
    none = np.full(st.shape, None, dtype=object)
    sampled = PassResult(correct=st == "correct", scored=st != "error", extracted=none, status=st,
                         n_tokens=np.ones(st.shape, dtype=np.int64), texts=none, generate_s=1.0)
    vs, pairs = compare_passk(sampled, [1, 2], ["ctl", "a", "b"], "ctl")
    lines = format_diff_table(vs, pairs, "ctl", [1, 2]).splitlines()
    assert "a - ctl (0 problems)" in lines[1] and "b - ctl (0 problems)" in lines[1] and "a - b (2 problems)" in lines[1]
    assert lines[2].startswith("pass@1") and lines[2].rstrip().endswith("+0.500 [+0.500, +0.500]")  # no count after
    assert lines[-1].startswith("pass@2")  # 2 problems are too few to size a larger study from: no planning line


def test_the_planning_line_sizes_each_comparison_from_its_own_pilot():
    """The diff block's last line: problems for a 3-point half-width at the largest k, from the per-problem sd;
    '-' where the pilot is under 10 problems or its two conditions never differed (sd 0 is no estimate)."""
    from engine.commands.eval import compare_passk, format_diff_table
    from engine.evaluation.passes import PassResult

    rng = np.random.default_rng(0)
    ctl = rng.random((30, 4)) < 0.3                                          # (N, G) correct samples
    st = np.array([np.where(ctl, "correct", "wrong"), np.where(ctl, "correct", "wrong"),
                   np.where(rng.random((30, 4)) < 0.6, "correct", "wrong")], dtype=object)
    none = np.full(st.shape, None, dtype=object)
    sampled = PassResult(correct=st == "correct", scored=st != "error", extracted=none, status=st,
                         n_tokens=np.ones(st.shape, dtype=np.int64), texts=none, generate_s=1.0)
    vs, pairs = compare_passk(sampled, [1, 4], ["ctl", "twin", "better"], "ctl")
    last = format_diff_table(vs, pairs, "ctl", [1, 4]).splitlines()[-1]
    sd = vs["better"]["4"]["sd"]
    assert sd > 0 and last.startswith("to size a larger study: problems for a 95 % half-width of 0.03 at pass@4")
    assert f"better - ctl {int(np.ceil((1.959964 * sd / 0.03) ** 2))}" in last
    assert "twin - ctl -," in last  # identical answers: no estimate, not "1 problem"


@pytest.mark.parametrize("case, conds, ks", [
    ("every sample of the control unscorable", [[["error"] * 4] * 3, [["correct"] * 4] * 3], [1, 2, 4]),
    ("n < max(ks) on some problems", [[["error", "correct", "wrong", "wrong"], ["wrong"] * 4],
                                      [["correct"] * 4, ["correct", "error", "error", "error"]]], [1, 2, 4]),
    ("a single problem", [[["correct", "wrong"]], [["wrong", "wrong"]]], [1, 2]),
    ("all correct", [[["correct"] * 4] * 5] * 2, [1, 2, 4]),
    ("all wrong", [[["wrong"] * 4] * 5] * 2, [1, 2, 4]),
    ("nothing scorable at all", [[["error"] * 4] * 2] * 2, [1, 2, 4]),
    ("three conditions, the control unscorable", [[["error"] * 2] * 2, [["correct", "wrong"]] * 2,
                                                  [["wrong", "wrong"]] * 2], [1, 2]),
])
def test_summary_edge_cases_are_standard_json_with_none_where_undefined(case, conds, ks):
    """Break-it pass on summarise/compare_passk: no crash, no NaN (strict JSON parsers refuse it), None where a
    value is undefined (no problem in the set), every defined interval around its value."""
    from engine.commands.eval import compare_passk, format_diff_table, format_table, summarise
    from engine.evaluation.passes import PassResult

    def result(statuses):
        st = np.array(statuses, dtype=object)                                   # (A, N, G)
        none = np.full(st.shape, None, dtype=object)
        return PassResult(correct=st == "correct", scored=st != "error", extracted=none, status=st,
                          n_tokens=np.ones(st.shape, dtype=np.int64), texts=none, generate_s=1.0)

    names = [f"c{i}" for i in range(len(conds))]
    greedy, sampled = result([[[p[0]] for p in c] for c in conds]), result(conds)
    summary = summarise(greedy, sampled, ks, names)
    vs, pairs = compare_passk(sampled, ks, names, names[0])
    text = json.dumps({"conditions": summary, "vs": vs, "pairs": pairs}, allow_nan=False)  # raises on NaN / inf
    for name, row in summary.items():
        for k in map(str, ks):
            v, ci = row["pass_at_k"][k], row["pass_at_k_ci95"][k]
            assert (v is None) == (ci is None) == (row["pass_at_k_problems"][k] == 0), (case, name, k)
            assert v is None or ci[0] - 1e-12 <= v <= ci[1] + 1e-12
    for table in [*vs.values(), *(p["pass_at_k"] for p in pairs)]:
        for d in table.values():
            assert (d["diff"] is None) == (d["problems"] == 0) and (d["diff"] is None or d["low"] <= d["diff"] <= d["high"])
    assert "nan" not in text.lower() and format_table(summary, len(conds[0][0]), ks, "t")
    format_diff_table(vs, pairs, names[0], ks)
