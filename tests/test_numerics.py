"""The numerics floor's measures (issue 42): pairwise verdict discordance, one-text share, the placebo
generation's statistics, and the lab's batch-slot noise knob."""
import itertools

import numpy as np
import pytest

from engine.evaluation.numerics import placebo_stats, share_line
from engine.lab.landscapes import MinibatchLandscape, MinibatchParams, placebo_discordance
from engine.results.stats import numerics_share, one_text_share, pairwise_discordance


def brute_discordance(r: np.ndarray) -> float:
    pairs = list(itertools.combinations(range(r.shape[0]), 2))
    return float(np.mean([np.mean(r[a] != r[b]) for a, b in pairs]))


@pytest.mark.parametrize("seed", range(5))
def test_pairwise_discordance_matches_counting_every_pair(seed):
    r = (np.random.default_rng(seed).random((7, 30)) < 0.4).astype(float)
    assert pairwise_discordance(r) == pytest.approx(brute_discordance(r))


def test_pairwise_discordance_is_zero_for_identical_verdicts_and_one_for_two_opposites():
    same = np.tile((np.arange(12) % 3 == 0).astype(float), (5, 1))
    assert pairwise_discordance(same) == 0.0
    assert pairwise_discordance(np.array([[1.0, 0.0], [0.0, 1.0]])) == 1.0
    assert np.isnan(pairwise_discordance(np.ones((1, 4))))


def test_pairwise_discordance_averages_samples_and_treats_unscorable_as_a_verdict():
    r = np.array([[[1, 0], [1, 1]], [[1, 0], [np.nan, np.nan]]], dtype=float)  # (P 2, N 2, G 2)
    assert pairwise_discordance(r) == 0.5  # prompt 0 agrees (mean 0.5 both), prompt 1 differs


def test_one_text_share_counts_prompts_where_every_candidate_wrote_the_same():
    texts = [["a", "b", "c"], ["a", "b", "x"], ["a", "y", "c"]]
    assert one_text_share(texts) == pytest.approx(1 / 3)
    assert np.isnan(one_text_share([]))


def test_placebo_stats_of_a_generation():
    rewards = np.array([[1, 0, 1, 1], [1, 0, 0, 1], [1, 0, 1, 1]], dtype=float)[:, :, None]
    texts = [["s", "t", "u", "v"], ["s", "t", "w", "v"], ["s", "t", "u", "v"]]
    out = placebo_stats(rewards, texts)
    assert (out.population, out.prompts, out.prompts_disagreeing) == (3, 4, 1)
    assert out.fitness_std == pytest.approx(np.std([0.75, 0.5, 0.75]))
    assert out.pairwise_discordance == pytest.approx(brute_discordance(rewards[:, :, 0]))
    assert out.one_text_share == 0.75
    assert "1 prompts disagree" in out.line() and "75 %" in out.line()


def test_numerics_share_is_capped_and_undefined_without_variance():
    assert numerics_share(0.0007, 0.0014) == pytest.approx(0.5)
    assert numerics_share(0.003, 0.001) == 1.0
    assert np.isnan(numerics_share(0.001, 0.0))
    assert "50 %" in share_line(0.0007, 0.0014) and "n/a" in share_line(0.1, 0.0)


def test_lab_numerics_knob_flips_identical_genomes_and_zero_keeps_them_tied():
    quiet = MinibatchLandscape(240, seed=5, prompts=64)
    noisy = MinibatchLandscape(240, seed=5, prompts=64, params=MinibatchParams(numerics=0.17))
    assert placebo_discordance(quiet, 9, 3) == 0.0
    d = placebo_discordance(noisy, 9, 3)
    assert 0.02 < d < 0.12  # the AMX bf16 placebo's 0.04-0.07 (issue 42) lies here
    x = np.zeros((4, 240))
    np.testing.assert_array_equal(noisy.rewards(x, 0, 1), noisy.rewards(x, 0, 1))  # deterministic per generation
    np.testing.assert_array_equal(noisy.held_out(x[0]), quiet.held_out(x[0]))  # held-out scores stay exact


def test_lab_numerics_knob_rejects_negative_values():
    with pytest.raises(ValueError, match="landscape.options.numerics"):
        MinibatchParams.with_options({"numerics": -0.1})


@pytest.mark.parametrize("knob", ["numerics", "chaos", "dense_eta"])
def test_lab_knobs_reject_infinity(knob):
    """inf passed the >= 0 rules and the lab ran on it (numerics=inf: verdicts of pure noise)."""
    with pytest.raises(ValueError, match=rf"^landscape.options.{knob}=inf: must be a finite number, e.g. "
                                         rf"\+landscape.options.{knob}="):
        MinibatchParams.with_options({knob: float("inf")})


# ----------------------------------------------------------------------------- engine.numerics
def _device(*flags, gpu=False):
    from engine.hardware import CPUInfo, DeviceInfo, GPUInfo

    return DeviceInfo(CPUInfo("test cpu", frozenset(flags), 2), GPUInfo("H100", True) if gpu else None)


AMX = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


@pytest.mark.parametrize("requested,dtype,device,env,mode", [
    ("auto", "bfloat16", _device(*AMX), {}, "fast"),                          # signal per second (lab)
    ("fast", "bfloat16", _device(*AMX), {}, "fast"),
    ("invariant", "float32", _device(*AMX), {}, "invariant"),                 # the CPU's invariant path
    ("invariant", "float32", _device("avx2"), {}, "invariant"),
    ("auto", "float32", _device("avx2"), {}, "fast"),
    ("invariant", "bfloat16", _device(*AMX, gpu=True), {"VLLM_BATCH_INVARIANT": "1"}, "invariant"),
    (" Fast ", "bfloat16", _device(*AMX, gpu=True), {}, "fast"),
])
def test_resolve_numerics_pins_answers_only_where_asked(requested, dtype, device, env, mode):
    from engine.hardware import resolve_numerics

    got_mode, got_env, reason = resolve_numerics(requested, dtype, device, environ={})
    assert (got_mode, got_env) == (mode, env) and reason


@pytest.mark.parametrize("flags", [AMX, ("avx2", "avx512f", "avx512_bf16")])
def test_invariant_on_a_cpu_in_bf16_is_refused_with_the_fix(flags):
    from engine.hardware import resolve_numerics

    with pytest.raises(ValueError, match=r"^engine.numerics=invariant on a CPU needs model.dtype=float32 .*add "
                                         r"model.dtype=float32"):
        resolve_numerics("invariant", "bfloat16", _device(*flags), environ={})


def test_resolve_numerics_keeps_a_switch_already_set_and_rejects_unknown_modes():
    from engine.hardware import resolve_numerics

    assert resolve_numerics("invariant", "bfloat16", _device(gpu=True), environ={"VLLM_BATCH_INVARIANT": "0"})[1] == {}
    with pytest.raises(ValueError, match=r"^engine.numerics='exact': use auto, fast .* or invariant"):
        resolve_numerics("exact", "bfloat16", _device(*AMX), environ={})


def test_every_engine_config_carries_numerics():
    from hydra import compose, initialize_config_dir

    from engine.backends.vllm_local import backend_kwargs
    from engine.commands import register_configs
    from engine.config import CONF_DIR

    register_configs()
    for name, overrides in (("train", []), ("train", ["engine=ray"]), ("eval", []), ("bench", []),
                            ("train", ["engine.numerics=fast"])):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name=name, overrides=overrides)
        kw = backend_kwargs(cfg.engine, max_lora_rank=8, max_loras=2, max_model_len=64, dtype="float32", seed=0)
        assert kw["numerics"] == ("fast" if overrides == ["engine.numerics=fast"] else "auto")


@pytest.mark.parametrize("name", ["train", "eval", "bench"])
def test_every_command_rejects_an_unknown_numerics_before_anything_loads(name):
    """A typo in engine.numerics is refused by the command's validate (essa train: before the warm start's
    minutes of SFT), not when the engine starts."""
    import importlib

    from hydra import compose, initialize_config_dir

    from engine.commands import register_configs
    from engine.config import CONF_DIR

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name=name, overrides=["engine.numerics=invariants"])
    with pytest.raises(ValueError, match=r"^engine.numerics='invariants': use auto, fast .* e.g. engine.numerics=auto$"):
        importlib.import_module(f"engine.commands.{name}_config").validate(cfg)


# ----------------------------------------------------------------------------- the final call's floor
def _final_run(numerics="fast", dtype="bfloat16"):
    from types import SimpleNamespace

    added = []
    run = SimpleNamespace(evaluator=SimpleNamespace(backend=SimpleNamespace(numerics=numerics, dtype=dtype)), P=16,
                          task=SimpleNamespace(val=[None] * 4), cfg=SimpleNamespace(eval=SimpleNamespace(max_tokens=8), seed=0),
                          validation=SimpleNamespace(add=lambda step, rewards: added.append(rewards)), condition_s=0.0,
                          dtype=(dtype, "test"), sft_dir=None)  # no warm-start directory: nothing cached
    return run, added


@pytest.mark.parametrize("flags,numerics,dtype,copied", [
    (AMX, "fast", "bfloat16", True), (AMX, "invariant", "bfloat16", False), (AMX, "fast", "float32", False),
    (("avx2", "avx512f", "avx512_bf16"), "fast", "bfloat16", False)])
def test_final_call_carries_a_warm_start_copy_only_where_slots_move_answers(monkeypatch, flags, numerics, dtype, copied):
    from engine.backends import AdapterRef
    from engine.commands import train

    monkeypatch.setattr("engine.hardware.detect_device", lambda: _device(*flags))
    run, _ = _final_run(numerics, dtype)
    sft = AdapterRef("sft", 7, "/adapters/sft")
    copy = train.numerics_copy(run, {"sft": sft, "mean": AdapterRef("mean", 8, "/m")}, 10)
    assert (copy is not None) == copied
    if copied:
        assert copy.path == sft.path and copy.lora_int_id not in (7, 8)
    assert train.numerics_copy(run, {"mean": AdapterRef("mean", 8, "/m")}, 10) is None  # no warm start, no copy


def test_final_call_note_counts_the_copy_flips_and_keeps_it_out_of_the_table(monkeypatch):
    from engine.backends import AdapterRef
    from engine.commands import train

    monkeypatch.setattr("engine.hardware.detect_device", lambda: _device(*AMX))
    seen = {}

    def fake_rewards(evaluator, conditions, problems, max_tokens, seed):
        seen.update(conditions)
        return {"sft": np.array([1.0, 0, 1, 0]), "mean": np.array([1.0, 1, 1, 0]), "sft_copy": np.array([1.0, 1, 0, 0])}

    monkeypatch.setattr("engine.evaluation.validation.held_out_rewards", fake_rewards)
    run, added = _final_run()
    note = train.validate_final(run, 10, {"sft": AdapterRef("sft", 7, "/s"), "mean": AdapterRef("mean", 8, "/m")})
    assert "sft_copy" in seen and "disagreed with it on 2 of 4 verdicts" in note
    assert set(added[0]) == {"sft", "mean"}


def _generation_result(status: str, completion: str):
    from types import SimpleNamespace

    P, N = 3, 2
    rows = P * N
    return SimpleNamespace(fitness=np.array([-1.0, -1.2, -0.9]), rewards=np.array([[[-1.0], [-1.0]], [[-1.1], [-1.3]],
                                                                               [[-0.9], [-0.9]]]),
                           rollouts={"candidate": [p for p in range(P) for _ in range(N)], "completion": [completion] * rows,
                                     "status": [status] * rows},
                           timings={}, tokens=10, dense=None)


def test_one_text_share_is_undefined_when_the_fitness_wrote_no_text():
    """rollout.fitness=likelihood writes no completion: its one_text_share is NaN, not 1 (which reads as invariant)."""
    from engine.commands.train import generation_row

    assert np.isnan(generation_row(0, 1.0, _generation_result("likelihood", ""), 3, 0.1, 0.0, 0.0)["one_text_share"])
    assert generation_row(0, 1.0, _generation_result("ok", "same"), 3, 0.1, 0.0, 0.0)["one_text_share"] == 1.0


def test_numerics_with_the_dtype_is_checked_before_anything_loads(monkeypatch):
    """check_numerics_dtype refuses what the run's resolve_numerics refuses (invariant in bf16 on a CPU, a GPU
    takes it), and asks for the device only for invariant (detect_device imports torch)."""
    import engine.hardware as hw

    with pytest.raises(ValueError, match=r"^engine.numerics=invariant on a CPU needs model.dtype=float32"):
        hw.check_numerics_dtype("invariant", "bf16", _device(*AMX))
    hw.check_numerics_dtype("invariant", "bfloat16", _device(*AMX, gpu=True))
    hw.check_numerics_dtype("invariant", "float32", _device("avx2"))
    with pytest.raises(ValueError, match=r"^model.dtype='bogus': use auto"):
        hw.check_numerics_dtype("auto", "bogus")
    monkeypatch.setattr(hw, "detect_device", lambda: pytest.fail("auto/fast must not look at the device"))
    hw.check_numerics_dtype("auto", "bfloat16")
    hw.check_numerics_dtype("fast", "float16")


@pytest.mark.parametrize("name, extra", [("train", []), ("eval", []), ("bench", [])])
def test_preview_refuses_invariant_in_bf16_on_a_cpu_as_the_run_does(name, extra, monkeypatch, capsys):
    """``essa <command> engine.numerics=invariant model.dtype=bfloat16 --cfg job`` on a CPU: the run's one line,
    exit 2 (it printed the config although the run refused it); on a GPU the config is printed."""
    import engine.hardware as hw
    from engine.cli import main

    monkeypatch.setattr(hw, "detect_device", lambda: _device(*AMX))
    argv = [name, "engine.numerics=invariant", "model.dtype=bfloat16", *extra, "--cfg", "job"]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("essa: error:")]
    assert e.value.code == 2 and len(err) == 1 and "needs model.dtype=float32" in err[0], err
    monkeypatch.setattr(hw, "detect_device", lambda: _device(*AMX, gpu=True))
    main(argv)
    assert "numerics: invariant" in capsys.readouterr().out
