"""The KL drift estimator (engine/evaluation/drift.py) against analytic KL, and the drift part of essa eval."""
from __future__ import annotations

import numpy as np
import pytest

from engine.evaluation.drift import Continuations, kl_estimate, log_ratios


@pytest.mark.parametrize("p, q", [
    ([0.5, 0.3, 0.2], [0.2, 0.3, 0.5]),
    ([0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]),
    ([0.4, 0.6], [0.4, 0.6]),  # equal distributions: KL 0
])
def test_monte_carlo_kl_matches_the_analytic_value(p, q):
    """Tokens drawn from p, log-ratios log p - log q: the estimate is KL(p || q) = sum p log p/q, inside
    its bootstrap interval, per prompt and token-weighted."""
    p, q = np.asarray(p), np.asarray(q)
    truth = float(np.sum(p * np.log(p / q)))
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 40, size=400)  # prompts with continuations of different lengths
    ratios = [np.log(p / q)[rng.choice(len(p), size=n, p=p)] for n in lengths]
    est = kl_estimate(ratios, n_boot=2000, seed=1)
    for key in ("kl_prompt", "kl_token"):
        lo, hi = est[f"{key}_ci95"]
        assert lo <= truth <= hi and abs(est[key] - truth) < 0.02 + 0.1 * truth, (key, est[key], truth)
    assert est["n_prompts"] == 400 and est["n_tokens"] == int(lengths.sum())


def test_token_weighted_differs_from_prompt_mean():
    est = kl_estimate([np.array([1.0]), np.array([0.0, 0.0, 0.0])])
    assert est["kl_prompt"] == pytest.approx(0.5) and est["kl_token"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="at least one"):
        kl_estimate([np.array([])])


class _Backend:
    """prompt_logprobs where each adapter scales the reference's log-probabilities: adapter k's log p is
    (1 + k) x the reference's, so KL(ref || ref) = 0 and it grows with k."""

    def prompt_logprobs(self, token_ids, adapters, use_tqdm=False):
        scale = lambda a: 1.0 if a is None else 1.0 + a.lora_int_id  # noqa: E731
        return [[-0.1 * scale(a) * t for t in ids[1:]] for ids, a in zip(token_ids, adapters)]


def test_log_ratios_score_reference_and_adapters_in_one_batch():
    from engine.backends import AdapterRef

    sample = Continuations(prompts=[[1, 2], [3]], tokens=[[4, 5], [6]])
    got = log_ratios(_Backend(), sample, None, {"same": None, "far": AdapterRef("a", 2, "/x")})
    assert all(np.allclose(r, 0) for r in got["same"])
    np.testing.assert_allclose(got["far"][0], [0.4 * 2, 0.5 * 2])  # ref -0.1 t, adapter -0.3 t
    assert kl_estimate(got["far"])["kl_token"] > kl_estimate(got["same"])["kl_token"] == 0


def test_an_adapter_for_another_base_model_is_refused_in_one_line(tmp_path):
    import json

    import torch

    from engine.lora.checks import check_adapter_fits
    from engine.lora.files import write_adapter

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2}))
    pre = "base_model.model.model.layers.{}.self_attn.q_proj"
    fits = {f"{pre.format(0)}.lora_A.weight": torch.zeros(2, 8), f"{pre.format(0)}.lora_B.weight": torch.zeros(8, 2)}
    check_adapter_fits(write_adapter(tmp_path / "ok", fits, 2, 4.0, "m"), str(model))
    wide = {f"{pre.format(0)}.lora_A.weight": torch.zeros(2, 16), f"{pre.format(0)}.lora_B.weight": torch.zeros(16, 2)}
    deep = {f"{pre.format(5)}.lora_A.weight": torch.zeros(2, 8), f"{pre.format(5)}.lora_B.weight": torch.zeros(8, 2)}
    for name, lora in (("wide", wide), ("deep", deep)):
        with pytest.raises(ValueError, match="trained for another base model") as e:
            check_adapter_fits(write_adapter(tmp_path / name, lora, 2, 4.0, "m"), str(model))
        assert "\n" not in str(e.value) and "model.path" in str(e.value)


@pytest.mark.integration
@pytest.mark.timeout(1200)
def test_drift_is_zero_for_the_reference_and_grows_with_the_adapters_scale(tmp_path):
    """essa eval with drift on the real model: an adapter equal to the reference (another copy of its
    files) has KL 0 within tolerance; the same adapter with B x 2 drifts further than with B x 1."""
    from hydra import compose, initialize_config_dir
    from transformers import AutoConfig

    from engine.commands import register_configs
    from engine.commands.eval import run_eval
    from engine.config import CONF_DIR
    from engine.lora.files import write_adapter
    from engine.model import resolve_model_path
    from tests.helpers import random_lora

    model = resolve_model_path("embedded:smollm2-135m-instruct")
    lora = random_lora(AutoConfig.from_pretrained(model), seed=3, std=0.05)
    reference = write_adapter(tmp_path / "reference", lora, 8, 16.0, model)
    write_adapter(tmp_path / "same", lora, 8, 16.0, model)
    for k in (2, 3):
        scaled = {n: (v * k if ".lora_B." in n else v) for n, v in lora.items()}
        write_adapter(tmp_path / f"x{k}", scaled, 8, 16.0, model)
    register_configs()
    overrides = [f"adapters=[{tmp_path / 'same'},{tmp_path / 'x2'},{tmp_path / 'x3'}]", "include_base=false",
                 "limit=2", "max_tokens=8", "engine.kv_cache_gib=1", "drift.enabled=true", "drift.sets=[svamp]",
                 "drift.prompts=12", "drift.max_tokens=32", f"drift.references=[{reference}]"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("eval", overrides=overrides)
    kl = run_eval(cfg, tmp_path / "out")["drift"]["reference"]["svamp"]
    assert abs(kl["same"]["kl_token"]) < 0.01, kl["same"]
    assert kl["x3"]["kl_token"] > kl["x2"]["kl_token"] > 0.01, (kl["x2"], kl["x3"])
    assert (tmp_path / "out" / "eval_drift.json").exists() and (tmp_path / "out" / "eval_drift_prompts.parquet").exists()


def test_report_draws_the_drift_figure_from_eval_directories(tmp_path):
    """essa report with an eval directory holding drift results: drift.png, one point per condition,
    KL averaged over the sets other than the eval's task."""
    import json

    from engine.results.report import build_figures, drift_points, load_run

    summary = {"label": "ev", "task": "arithmetic", "n": 1, "conditions": {"mean": {"greedy_accuracy": 0.3},
                                                                          "final": {"greedy_accuracy": 0.28}},
               "drift": {"warm_start": {"arithmetic": {"mean": {"kl_token": 0.5}, "final": {"kl_token": 0.9}},
                                        "svamp": {"mean": {"kl_token": 0.02}, "final": {"kl_token": 0.04}},
                                        "gsm8k": {"mean": {"kl_token": 0.04}, "final": {"kl_token": 0.06}}}}}
    (tmp_path / "eval_summary.json").write_text(json.dumps(summary))
    run = load_run(tmp_path)
    pts = sorted(drift_points(run, "ev"))
    assert [round(x, 3) for x, _, _ in pts] == [0.03, 0.05] and [y for _, y, _ in pts] == [0.3, 0.28]
    assert "drift" in build_figures([run])


class _Sampler:
    """generate() of a back-end with a ``dtype``: one continuation per prompt, its calls counted."""

    def __init__(self, dtype: str):
        self.dtype, self.calls = dtype, 0

    def generate(self, prompts, adapters, sampling, use_tqdm=False):
        from engine.backends import Completion

        self.calls += 1
        return [[Completion("x", 2, token_ids=[7, 8])] for _ in prompts]


def test_drift_cache_key_holds_the_dtype_and_the_sampling(tmp_path, monkeypatch):
    """Issue 40: a bf16 and a float32 run shared one cache entry of the reference's continuations (the key
    had neither the dtype nor the sampling settings). Each distinct setting samples anew; a repeat hits."""
    from types import SimpleNamespace

    import engine.commands.eval_drift as eval_drift

    monkeypatch.setenv("ESSA_CACHE", str(tmp_path))
    monkeypatch.setattr(eval_drift, "set_prompts", lambda name, n, tok: (["p1", "p2"], [[1, 2], [3]]))
    cfg = SimpleNamespace(drift=SimpleNamespace(prompts=2, max_tokens=8, seed=0))
    calls = []
    for dtype in ("bfloat16", "float32", "float32"):
        backend = _Sampler(dtype)
        eval_drift.continuations(backend, "sft", None, "svamp", cfg, None, "/models/m")
        calls.append(backend.calls)
    assert calls == [1, 1, 0]  # bf16 sampled, float32 sampled (not bf16's), float32 again from the cache
    keys = [path.read_text() for path in (tmp_path / "drift").glob("*.json")]
    assert len(keys) == 2 and all('"temperature": 1.0' in k and '"top_p": 1.0' in k for k in keys)
