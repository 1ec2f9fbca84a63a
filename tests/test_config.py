"""Config composition and validation: the real conf/ tree composed through Hydra (no engine)."""
from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from engine.config import CONF_DIR
from engine.commands import register_configs
from engine.commands.train_config import validate
from engine.config import ConfigError
from engine.commands.train_checkpoint import config_key
from engine.tasks import minibatch
from engine.tasks import Problem

register_configs()


def train_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def test_default_config_composes_and_validates():
    cfg = train_cfg()
    validate(cfg)
    assert cfg.model.path == "embedded:smollm2-135m-instruct"
    assert cfg.task.name == "arithmetic" and cfg.strategy.name == "essa"
    assert cfg.strategy.genome.kind == "svd_lora" and cfg.engine.backend == "local"


@pytest.mark.parametrize("group,option", [("task", "gsm8k"), ("task", "math500"), ("task", "svamp"),
                                          ("task", "countdown"), ("task", "chain_sum"), ("task", "basic_arithmetic"),
                                          ("task", "gsm_symbolic"), ("logger", "tensorboard"), ("logger", "mlflow"),
                                          ("logger", "wandb"),
                                          ("strategy", "cma_es"), ("strategy", "sep_cma"), ("engine", "ray"),
                                          ("sft", "off"), ("model", "qwen2.5-7b")])
def test_every_group_option_composes(group, option):
    cfg = train_cfg(f"{group}={option}")
    validate(cfg)


def test_experiment_overlay_shrinks_the_run():
    cfg = train_cfg("+experiment=tiny")
    assert cfg.generations == 2 and cfg.strategy.population_size == 4 and cfg.report is False


@pytest.mark.parametrize("override,error", [
    ("strategy.popsize=3", ConfigCompositionException),          # misspelt key
    ("strategy.population_size=abc", ConfigCompositionException),  # wrong type
    ("rollout.max_tokns=5", ConfigCompositionException),
    ("strategy=nope", ConfigCompositionException),                # unknown group option
])
def test_typos_and_wrong_types_fail_at_compose(override, error):
    with pytest.raises(error):
        train_cfg(override)


@pytest.mark.parametrize("override,field", [
    ("strategy.population_size=1", "strategy.population_size"),
    ("strategy.sigma0=0", "strategy.sigma0"),
    ("lora.rank=0", "lora.rank"),
    ("lora.rank=1024", "lora.rank"),
    ("strategy.genome.alpha=1.5", "strategy.genome.alpha"),
    ("engine.max_loras=2", "engine.max_loras"),
    ("rollout.max_tokens=0", "rollout"),
    ("engine.backend=gpu", "engine.backend"),
    ("rollout.temperature=-1", "rollout.temperature"),
    ("rollout.top_p=2", "rollout.top_p"),
    ("eval.every=-1", "eval.every"),
    ("eval.max_tokens=0", "eval.max_tokens"),
    ("sft.max_steps=0", "sft"),
    ("sft.batch_size=0", "sft"),
    ("sft.lr=0", "sft"),
    ("strategy.genome.kind=nope", "strategy.genome.kind"),
    ("strategy.genome.mode=nope", "strategy.genome.mode"),
    # start-up checks of values that used to reach the warm start or vLLM (break-it findings)
    ("lora.alpha=0", "lora.alpha"),
    ("lora.alpha=-16", "lora.alpha"),
    ("lora.target_modules=[]", "lora.target_modules"),
    ("rollout.temperature=nan", "rollout.temperature"),
    ("rollout.temperature=inf", "rollout.temperature"),
    ("strategy.sigma0=nan", "strategy.sigma0"),
    ("engine.kv_cache_gib=0", "engine.kv_cache_gib"),
    ("engine.gpu_memory_utilization=0", "engine.gpu_memory_utilization"),
    ("engine.gpu_memory_utilization=1.5", "engine.gpu_memory_utilization"),
    ("engine.max_num_seqs=0", "engine.max_num_seqs"),
    ("model.max_model_len=0", "model.max_model_len"),
    ("model.max_model_len=96", "rollout.max_tokens=96 >= model.max_model_len=96"),
    ("model.max_model_len=64", "rollout.max_tokens"),
    ("reward.timeout_s=0", "reward.timeout_s"),
    ("task=countdown rollout.dense=tiebreak", "rollout.dense"),
    ("reward.timeout_s=nan", "reward.timeout_s"),
    ("strategy.genome.alpha=0.1", "strategy.genome.alpha=0.1 gives floor(alpha * r) = 0"),
    ("deadline_s=0", "deadline_s"),
    ("deadline_s=-5", "deadline_s"),
    ("deadline_s=inf", "deadline_s"),
    ("rollout.placebo=true rollout.adaptive_prompts=true", "rollout.adaptive_prompts=false"),  # N would move
])
def test_validate_names_the_field(override, field):
    cfg = train_cfg(*override.split())
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    msg = str(e.value)
    assert field in msg and "\n" not in msg


def test_deadline_prices_the_next_generation_and_the_final_call():
    """deadline_allows (issue 10): the next generation and the final call's paired test (sft, mean and
    best; 1 condition = 500 problems x 40 tokens / 400 tok/s = 50 s) must end by deadline_s; nothing
    else is reserved (issue 26: generations first)."""
    from engine.commands.train_schedule import condition_price_s, deadline_allows

    cfg = train_cfg("deadline_s=1000", "eval.every=5", "eval.max_tokens=96", "generations=10", "eval.samples=8")
    price = condition_price_s(cfg, 500, tokens_per_completion=40.0, tokens_per_s=400.0)
    assert price == 50.0
    assert condition_price_s(cfg, 500, 40.0, 400.0, condition_s=30.0) == 30.0  # a timed validation wins
    assert condition_price_s(train_cfg("eval.max_tokens=20"), 500, 96.0, 400.0) == 25.0  # capped at eval.max_tokens
    assert deadline_allows(cfg, 2, 750.0, 100.0, price)            # 750 + 100 + 3 x 50 = 1000
    assert not deadline_allows(cfg, 2, 751.0, 100.0, price)
    assert deadline_allows(cfg, 5, 750.0, 100.0, price)            # a periodic validation due or not: not reserved
    no_baselines = train_cfg("deadline_s=1000", "eval.baselines=false")
    assert deadline_allows(no_baselines, 2, 800.0, 100.0, price)   # mean + best only
    assert deadline_allows(train_cfg("eval.every=0"), 2, 1e9, 100.0, price)  # null: no deadline


def test_periodic_validation_runs_only_if_it_costs_no_generation():
    """generations_that_fit / periodic_validation_fits: with 1000 s left after the final call (3 x 50 s)
    and 100 s generations, 10 fit; a 50 s validation first still leaves 9 whole ones only when the slack
    allows it."""
    from engine.commands.train_schedule import generations_that_fit, periodic_validation_fits

    cfg = train_cfg("deadline_s=1150", "eval.every=5", "generations=20")
    assert generations_that_fit(cfg, 0, 0.0, 100.0, 50.0) == 10
    assert generations_that_fit(cfg, 0, 0.0, 100.0, 50.0, first_s=50.0) == 9
    assert generations_that_fit(cfg, 15, 0.0, 100.0, 50.0) == 5                 # at most the generations left
    assert generations_that_fit(cfg, 0, 2000.0, 100.0, 50.0) == 0
    assert not periodic_validation_fits(cfg, 5, 0.0, 100.0, 50.0)               # 10 -> 9: it would cost one
    assert periodic_validation_fits(cfg, 5, 40.0, 100.0, 50.0)                  # 9 either way (910 / 860 s left)
    assert periodic_validation_fits(cfg, 15, 0.0, 100.0, 50.0)                  # 5 left fit either way
    assert periodic_validation_fits(train_cfg("eval.every=5"), 5, 1e9, 100.0, 50.0)  # no deadline


def test_sampled_pass_runs_only_if_it_fits_after_the_final_call():
    """sampled_pass_s: 2 conditions x 100 problems x 8 samples at 50 s per 500 completions = 160 s;
    fits_deadline: the final call's extras run only if they end by deadline_s."""
    from engine.commands.train_schedule import fits_deadline, sampled_pass_s

    cfg = train_cfg("deadline_s=1000", "eval.samples=8", "eval.sample_problems=100")
    assert sampled_pass_s(cfg, condition_s=50.0, n_val=500) == 160.0
    assert sampled_pass_s(cfg, condition_s=50.0, n_val=50) == 800.0  # 50 s per 50 completions: 2 x 50 x 8
    assert fits_deadline(cfg, 840.0, 160.0) and not fits_deadline(cfg, 841.0, 160.0)
    assert fits_deadline(train_cfg("eval.samples=8"), 1e9, 160.0)  # no deadline


def test_max_model_len_names_eval_max_tokens():
    with pytest.raises(ConfigError, match=r"eval\.max_tokens=300 >= model\.max_model_len=256"):
        validate(train_cfg("model.max_model_len=256", "rollout.max_tokens=32", "eval.max_tokens=300"))
    validate(train_cfg("+experiment=tiny", "model.max_model_len=512"))  # the suite's pipeline settings still pass
    validate(train_cfg("strategy.genome.alpha=0.125"))  # floor(0.125 * 8) = 1
    validate(train_cfg("strategy.genome.alpha=0.1", "strategy.genome.kind=lora"))  # alpha unused by the lora codec


def test_tinylora_genome_is_checked_and_described():
    """strategy.genome.kind=tinylora: u >= 1 (one line naming the field), D = u tied or u x modules, and the
    start line's words; alpha is not read (floor(0.1 r) = 0 would refuse an svd_lora genome)."""
    from engine.search import genome_dim, genome_kwargs, genome_text

    cfg = train_cfg("strategy.genome.kind=tinylora", "strategy.genome.u=13", "strategy.genome.alpha=0.1")
    validate(cfg)
    g = cfg.strategy.genome
    shapes = [(576, 576)] * 120
    assert genome_kwargs(g) == {"u": 13, "tied": True} and genome_dim(g, 8, shapes) == 13
    assert genome_text(g, 13) == "genome tinylora (u 13, tied): D 13"
    untied = train_cfg("strategy.genome.kind=tinylora", "strategy.genome.tied=false").strategy.genome
    assert genome_dim(untied, 8, shapes) == 16 * 120 and "one vector per module" in genome_text(untied)
    with pytest.raises(ConfigError, match=r"zero without SFT \(sft\.enabled=false\)"):
        validate(train_cfg("strategy.genome.kind=tinylora", "sft=off"))
    with pytest.raises(ConfigError, match=r"^strategy\.genome\.u=0: must be >= 1") as e:
        validate(train_cfg("strategy.genome.kind=tinylora", "strategy.genome.u=0"))
    assert "\n" not in str(e.value)


def test_resume_key_ignores_generations_but_not_strategy():
    a, b, c = train_cfg(), train_cfg("generations=50"), train_cfg("strategy.sigma0=0.2")
    assert config_key(a) == config_key(b)
    assert config_key(a) != config_key(c)


def test_resume_refusal_names_the_differing_fields(tmp_path):
    from omegaconf import OmegaConf

    from engine import io
    from engine.commands.train import run_train
    from engine.commands.train_checkpoint import CHECKPOINT, CHECKPOINT_VERSION, resume_config
    old = train_cfg()
    io.write_pickle(tmp_path / CHECKPOINT, {"version": CHECKPOINT_VERSION, "config_key": config_key(old),
                                            "config": resume_config(old)})
    with pytest.raises(ValueError) as e:
        run_train(train_cfg(f"resume={tmp_path}", "strategy.sigma0=0.2", "seed=5"), tmp_path)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"strategy.sigma0: {old.strategy.sigma0} in the checkpoint, 0.2 now" in msg
    assert f"seed: {old.seed} in the checkpoint, 5 now" in msg and "in 2 field(s)" in msg
    assert f"seed={old.seed}" in msg and f"strategy.sigma0={old.strategy.sigma0}" in msg and "without resume" in msg
    # a checkpoint without the stored config (older runs): the fields come from Hydra's saved config
    io.write_pickle(tmp_path / CHECKPOINT, {"version": CHECKPOINT_VERSION, "config_key": config_key(old)})
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(old, tmp_path / ".hydra" / "config.yaml")
    with pytest.raises(ValueError, match=r"in 1 field\(s\) \(task.val_size: \d+ in the checkpoint, 7 now\)"):
        run_train(train_cfg(f"resume={tmp_path}", "task.val_size=7"), tmp_path)


def test_resume_accepts_a_field_added_since_at_its_default(tmp_path):
    """A checkpoint written before a field existed (here rollout.common_seeds) resumes when the field is
    at its schema default, and is refused, naming the way out, when it is not."""
    from engine.commands.train_checkpoint import resume_config, resume_mismatch
    old = resume_config(train_cfg())
    del old["rollout"]["common_seeds"]
    ckpt = {"config_key": "written-by-an-older-version", "config": old}
    assert resume_mismatch(ckpt, train_cfg(), tmp_path) is None
    msg = resume_mismatch(ckpt, train_cfg("rollout.common_seeds=false"), tmp_path)
    assert "rollout.common_seeds: <unset> in the checkpoint, false now" in msg
    assert "rollout.common_seeds at its default" in msg
    assert resume_mismatch(ckpt, train_cfg("seed=9"), tmp_path) is not None  # other differences still count


def test_resume_refuses_a_changed_reward_and_accepts_checkpoints_from_before_reward_counted(tmp_path):
    """The reward defines the fitness: resume= with reward.lenient changed is refused; a checkpoint
    written before ``reward`` was among RESUME_KEYS resumes at the default reward."""
    from engine.commands.train_checkpoint import config_key, resume_config, resume_mismatch
    now = resume_config(train_cfg())
    ckpt = {"config_key": config_key(train_cfg()), "config": now}
    assert resume_mismatch(ckpt, train_cfg(), tmp_path) is None
    assert "reward.lenient" in resume_mismatch(ckpt, train_cfg(f"reward.lenient={not train_cfg().reward.lenient}"), tmp_path)
    older = {k: v for k, v in now.items() if k != "reward"}
    assert resume_mismatch({"config_key": "older", "config": older}, train_cfg(), tmp_path) is None


def test_minibatch_is_fresh_per_generation_and_reproducible():
    train = [Problem(str(i), f"q{i}", str(i)) for i in range(100)]
    b0, b0_again, b1 = minibatch(train, 16, 0, 0), minibatch(train, 16, 0, 0), minibatch(train, 16, 0, 1)
    assert [p.id for p in b0] == [p.id for p in b0_again]
    assert [p.id for p in b0] != [p.id for p in b1]
    assert len({p.id for p in b0}) == 16


def test_unknown_keys_catches_plus_overrides_only():
    from engine.cli.overrides import unknown_keys

    assert unknown_keys(train_cfg(), "train") == []
    assert sorted(unknown_keys(train_cfg("+strategy.popsize=4", "+foo=1"), "train")) == ["foo", "strategy.popsize"]
    assert unknown_keys(train_cfg("strategy.options.diagonal=true"), "train") == []  # free-form dict


def test_strategy_options_checked_before_sft():
    from engine.config import ConfigError
    from engine.search import check_strategy_options
    from strategies import get_strategy

    cls = get_strategy("essa")
    check_strategy_options(cls, train_cfg("strategy.options.diagonal=true").strategy, 0)
    for bad in ("++strategy.options.bogus=1", "strategy.options.diagonal=abc"):
        with pytest.raises(ConfigError, match="strategy.options"):
            check_strategy_options(cls, train_cfg(bad).strategy, 0)


@pytest.mark.parametrize("strategy, population, expect", [
    ("lra_cma", 3, "strategy.population_size=3: LRACMAES rejects it (strategy.population_size must be >= 4 for "
                   "strategy=lra_cma (got 3); cmaes needs at least two positive weights); e.g. strategy.population_size=4"),
    ("openai_es", 15, "strategy.population_size=15: OpenAIES rejects it (strategy.population_size must be even for "
                      "strategy=openai_es (got 15): candidates come in mirrored pairs +eps, -eps); e.g. "
                      "strategy.population_size=16"),
])
def test_population_size_error_is_one_line_without_the_options(strategy, population, expect):
    """Issue 40: the error named strategy.options={...} first although the options were fine (main's
    check_strategy_options now names the field; this pins it, and the strategy.name path too)."""
    from engine.config import ConfigError
    from engine.search import check_strategy_options
    from engine.search.plugins import check_strategy_choice
    from strategies import get_strategy

    cfg = train_cfg(f"strategy={strategy}", f"strategy.population_size={population}")
    with pytest.raises(ConfigError) as e:
        check_strategy_options(get_strategy(strategy), cfg.strategy, 0)
    assert str(e.value) == expect
    cfg = train_cfg(f"strategy.name={strategy}", f"strategy.population_size={population}", "strategy.options={}")
    cfg.strategy.options = {"ties": "average"} if strategy == "lra_cma" else {"optimizer": "sgd"}
    with pytest.raises(ConfigError) as e:  # picked by strategy.name on top of another group option
        check_strategy_choice(cfg.strategy, 0, "essa")
    assert str(e.value) == expect


@pytest.mark.parametrize("argv, expect", [
    (["strategy.population_size=abc"], "strategy.population_size=abc"),
    (["strategy.popsize=4"], "strategy.popsize: no such field"),
    (["+strategy.popsize=4"], "strategy.popsize: no such field"),
    (["task=nope"], "available: arithmetic"),
    (["strategy.sigma0=0.1,0.2"], "add -m to sweep"),
    # a misspelt field names the nearest one (difflib), also in a sweep and with Hydra's flags
    (["strategy.sigma00=0.3"], "strategy.sigma00: no such field; did you mean strategy.sigma0=0.3?"),
    (["genrations=3"], "genrations: no such field; did you mean generations=3?"),
    (["-m", "genrations=3,4"], "genrations: no such field; did you mean generations=3,4?"),
    (["--cfg", "job", "task.pathh=x"], "task.pathh: no such field; did you mean task.path=x?"),
    (["+strategy.popsize=4"], "did you mean strategy.population_size?"),
    (["zzzzqq=1"], "zzzzqq: no such field; check the spelling"),
])
def test_cli_composition_errors_are_one_line(argv, expect, capsys):
    from engine.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["train", *argv])
    assert exc.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("essa: error:") and expect in err[0], err


def test_hydra_full_error_keeps_the_full_trace(monkeypatch):
    """HYDRA_FULL_ERROR=1: a misspelt field raises Hydra's own exception (its traceback), not one line."""
    from hydra.errors import ConfigCompositionException

    from engine.cli import main

    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ConfigCompositionException, match="Could not override 'genrations'"):
        main(["train", "genrations=3"])


@pytest.mark.parametrize("command", ["train", "grpo", "eval"])
def test_unknown_field_names_the_actual_command(command, capsys):
    """The --cfg hint of a misspelt field names the command that was run, not a literal '<command>'."""
    from engine.cli import main

    with pytest.raises(SystemExit) as exc:
        main([command, "task.pathh=x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert f"`essa {command} --cfg job`" in err and "<command>" not in err and "\n" not in err, err


@pytest.mark.parametrize("argv, expect", [
    # a group of another command: named, with the commands that take it and this command's groups
    (["eval", "+experiment=tiny"], "override '+experiment=tiny': config group 'experiment' does not apply to "
                                   "essa eval (essa train accepts it); essa eval's groups: engine, model, reward, task"),
    (["eval", "strategy=essa"], "config group 'strategy' does not apply to essa eval (essa train and essa lab accept it)"),
    (["eval", "sft=off"], "(essa train and essa grpo accept it)"),
    (["grpo", "+experiment=tiny"], "essa grpo's groups: logger, model, reward, sft, task"),
    (["bench", "+experiment=tiny"], "essa bench takes no config groups"),  # bench composed it silently
    # an overlay group without '+'
    (["train", "experiment=tiny"], "add it with '+': +experiment=tiny"),
    # the command's own group with a bad option keeps Hydra's list of options
    (["train", "+experiment=nope"], "no config 'experiment/nope'; available: tiny"),
])
def test_cli_group_overrides_name_the_command(argv, expect, capsys):
    from engine.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("essa: error:") and expect in err[0], err


def test_group_override_check_passes_accepted_overrides():
    from engine.cli.compose import composer_for, parse_args
    from engine.cli.hydra_app import run_job
    from engine.cli.overrides import config_groups, group_override_error
    from engine.commands import COMMANDS

    def check(command, argv):
        composer = composer_for(parse_args(argv), COMMANDS[command].yaml, run_job, str(CONF_DIR))
        return group_override_error(command, composer)

    assert config_groups("train") == ["engine", "logger", "model", "reward", "sft", "strategy", "task"]
    assert config_groups("bench") == []
    assert check("train", ["+experiment=tiny", "task=gsm8k", "strategy.sigma0=0.2"]) is None
    assert check("eval", ["task=gsm8k", "n=2"]) is None
    assert check("bench", ["populations=[4]"]) is None
    assert check("eval", ["+experiment=tiny"]).startswith("override '+experiment=tiny'")  # the check can fail


@pytest.mark.parametrize("override, start", [
    ("strategy.name=nope", "strategy.name='nope' is not a known strategy"),
    ("strategy._target_=no_such_pkg.Nope", "strategy._target_='no_such_pkg.Nope' is not a known strategy"),
])
def test_unknown_strategy_names_the_field_and_the_choices(override, start, tmp_path):
    from engine.commands.train import run_train
    from engine.search.plugins import check_strategy_choice

    cfg = train_cfg(override)
    for check in (lambda: check_strategy_choice(cfg.strategy, cfg.seed, "essa"), lambda: run_train(cfg, tmp_path)):
        with pytest.raises(ValueError) as e:
            check()
        msg = str(e.value)
        assert msg.startswith(start) and "\n" not in msg, msg
        assert "built-in cma_es, corp, essa, " in msg and "sep_cma; installed plugins" in msg and "dotted path" in msg


def test_resuming_a_finished_run_stops_unless_generations_was_raised(tmp_path, monkeypatch):
    """Resume of a run whose checkpoint holds its last generation and that wrote summary.json: one line
    instead of a repeated final validation with duplicate rows; a raised generations= goes on as before."""
    from engine import io
    from engine.commands.train import run_train
    from engine.commands.train_checkpoint import CHECKPOINT, CHECKPOINT_VERSION, RunState, resume_config
    old = train_cfg("generations=2")
    io.write_pickle(tmp_path / CHECKPOINT, {"version": CHECKPOINT_VERSION, "config_key": config_key(old),
                                            "config": resume_config(old), "run_state": dataclasses.asdict(RunState(generation=1)),
                                            "strategy": {}})
    io.write_json(tmp_path / "summary.json", {"val": {}})
    with pytest.raises(ValueError) as e:
        run_train(train_cfg(f"resume={tmp_path}", "generations=2"), tmp_path)
    msg = str(e.value)
    assert msg == (f"resume: {tmp_path} already finished all 2 generations; raise generations=4 (any value > 2) "
                   f"to continue, or start a new run")

    class PastTheCheck(Exception):
        pass

    def stop(*a, **kw):
        raise PastTheCheck

    monkeypatch.setattr("engine.model.resolve_model_path", stop)
    with pytest.raises(PastTheCheck):
        run_train(train_cfg(f"resume={tmp_path}", "generations=3"), tmp_path)


def test_run_label_keeps_what_shapes_training_and_drops_run_control():
    from engine.results.run_files import run_label

    overrides = ["seed=1", "strategy.genome.alpha=1", "deadline_s=1680", "resume=/r", "report=false",
                 "hydra.run.dir=/x", "+strategy.options.cma_options.CMA_mirrors=8"]
    assert run_label("essa", None, overrides) == "essa seed=1 strategy.genome.alpha=1 " \
                                                 "+strategy.options.cma_options.CMA_mirrors=8"
    assert run_label("essa", "mine", overrides) == "mine"
    assert run_label("grpo", None, []) == "grpo"


def test_generation_sampling_shares_seeds_between_candidates_and_centre():
    """The centre (candidate P) is a paired control at temperature > 0 too: one Sampling serves the
    whole population, and under common seeds a prompt's seed does not depend on the adapter."""
    from engine.backends import AdapterRef
    from engine.commands.train_schedule import generation_sampling

    cfg = train_cfg("rollout.temperature=0.8", "rollout.samples_per_prompt=2")
    s3, s4 = generation_sampling(cfg.rollout, cfg.seed, 3), generation_sampling(cfg.rollout, cfg.seed, 4)
    assert s3.common_seeds and s3.n == 2 and s3.temperature == 0.8 and s3.seed != s4.seed
    candidates = [AdapterRef(f"c{k}", k + 1, "/x") for k in range(5)]  # 4 candidates + the centre
    prompts = ["q0", "q1", "q2"]
    seeds = s3.request_seeds([p for _ in candidates for p in prompts], [a for a in candidates for _ in prompts])
    assert all(seeds[k * 3:(k + 1) * 3] == seeds[:3] for k in range(5))
    own_cfg = train_cfg("rollout.temperature=0.8", "rollout.common_seeds=false")
    own = generation_sampling(own_cfg.rollout, own_cfg.seed, 3)
    assert len(set(own.request_seeds(prompts * 2, candidates[:2] * 3))) == 6


def test_a_plugin_with_a_bad_config_warns_once_per_process(monkeypatch, caplog):
    """A plugin whose class attribute `config` is not a dict of strategy fields is registered with the
    schema defaults and warned about once, though train and lab both register it (it warned twice)."""
    import types

    import strategies
    from engine.search import plugins

    class BadConfig(strategies.Strategy):
        config = {"popsize": 8}

    ep = types.SimpleNamespace(name="bad_cfg_plugin", value="tests.fake:BadConfig", load=lambda: BadConfig)
    monkeypatch.setattr(strategies, "plugin_entry_points", lambda: [ep])
    monkeypatch.setattr(plugins, "_WARNED", set())
    from hydra.core.config_store import ConfigStore

    try:
        with caplog.at_level("WARNING", logger="essa"):
            register_configs()
            register_configs()
        warned = [r for r in caplog.records if "bad_cfg_plugin" in r.getMessage()]
        assert len(warned) == 1 and "`config` must be a dict" in warned[0].getMessage()
        assert "bad_cfg_plugin" in plugins.strategy_options_available()
    finally:  # the ConfigStore is process-wide: other tests list the strategy options
        ConfigStore.instance().repo.get("strategy", {}).pop("bad_cfg_plugin.yaml", None)


def test_a_plugin_whose_import_calls_sys_exit_breaks_no_command_and_is_one_line_when_picked(monkeypatch):
    """A plugin module that calls sys.exit() on import used to stop every command (SystemExit escaped
    the import guard); it is now registered by name, and picking it is one ValueError naming it."""
    import types

    import strategies
    from engine.search import plugins

    def exits():
        raise SystemExit(3)

    ep = types.SimpleNamespace(name="exiting_plugin", value="tests.fake:Exits", load=exits)
    monkeypatch.setattr(strategies, "plugin_entry_points", lambda: [ep])
    from hydra.core.config_store import ConfigStore

    try:
        register_configs()
        assert "exiting_plugin" in plugins.strategy_options_available()
        with pytest.raises(ValueError, match=r"strategy\.name='exiting_plugin': the plugin's entry point "
                                             r"tests\.fake:Exits does not load \(SystemExit: 3\)"):
            strategies.get_strategy("exiting_plugin", field="strategy.name")
    finally:
        ConfigStore.instance().repo.get("strategy", {}).pop("exiting_plugin.yaml", None)


def test_a_dotted_path_whose_module_calls_sys_exit_is_one_line(tmp_path, monkeypatch):
    """strategy._target_=pkg.Cls of a module that calls sys.exit(0) on import ended the command with rc 0 and
    no output; a multi-line import error is folded into the one line."""
    import strategies

    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"^strategy\._target_='exits_on_import\.Cls': importing module "
                                         r"'exits_on_import' called sys\.exit \(SystemExit: 0\)"):
        strategies.get_strategy("exits_on_import.Cls", field="strategy._target_")
    assert strategies._one_line(RuntimeError("line one\n  line two\n")) == "RuntimeError: line one / line two"
    assert strategies._one_line(SystemExit()) == "SystemExit"


def test_deadline_skips_a_periodic_validation_before_it_stops_the_run(caplog):
    """Generations come first under deadline_s (issue 26): a periodic validation that would cost a
    generation is skipped (and listed), not the generation."""
    import time
    import types
    from pathlib import Path

    from engine.commands.train import _deadline_decision

    cfg = train_cfg("deadline_s=1000", "eval.every=5", "eval.max_tokens=96", "generations=10", "eval.samples=0")
    result = types.SimpleNamespace(tokens=40 * 64, rollouts={"candidate": [0] * 64})  # 40 tokens per completion

    def decide(g: int, elapsed_s: float):
        run = types.SimpleNamespace(cfg=cfg, t_command=time.perf_counter() - elapsed_s, slowest_s=100.0,
                                    task=types.SimpleNamespace(val=[None] * 500), condition_s=None, skipped=[],
                                    state=types.SimpleNamespace(wall_s=0.0, skipped_steps=[]), stopped_by="generations",
                                    run_dir=Path("run"))
        return _deadline_decision(run, g, result, {"tokens_per_s": 400.0}), run  # 1 condition = 50 s

    assert decide(2, 740.0)[0] == "run"                  # 740 + 100 + 3 x 50 = 990
    decision, run = decide(4, 740.0)                    # the step-5 validation first: 1040 > 1000
    assert decision == "skip validation" and run.skipped == ["validation step 5"] and run.state.skipped_steps == [5]
    assert decide(4, 590.0)[0] == "run"                  # 260 s left after the final call: 2 generations either way
    assert decide(4, 640.0)[0] == "skip validation"      # 210 s: 2 generations, 1 after a 50 s validation
    decision, run = decide(4, 900.0)
    assert decision == "stop" and run.stopped_by == "deadline_s" and run.skipped == []
    assert decide(9, 1e9)[0] == "run"                    # the last generation: nothing left to decide


def test_base_model_score_left_to_the_end_comes_from_the_cache_or_fits_or_is_skipped(monkeypatch):
    """Under deadline_s a base model not in the cache is scored after the final call (issue 26: generations
    first): from the cache if a run filled it meanwhile, scored if 1.5 final-call conditions still fit, else skipped."""
    import time
    import types
    from pathlib import Path

    import numpy as np

    import engine.commands.train as train

    scored = {"no_adapter": np.array([1.0, 0.0])}
    calls = []

    def fake_base(run, score=True):
        calls.append(score)
        return scored if (score or run.cached) else None

    monkeypatch.setattr(train, "base_model_rewards", fake_base)

    def late(cached: bool, elapsed_s: float, rows=(), baselines=True):
        log = types.SimpleNamespace(rows=list(rows), added=[])
        log.add = lambda step, rewards: log.added.append((step, sorted(rewards)))
        run = types.SimpleNamespace(cfg=train_cfg("deadline_s=1000", f"eval.baselines={str(baselines).lower()}"),
                                    validation=log, cached=cached, condition_s=100.0, skipped=[],
                                    t_command=time.perf_counter() - elapsed_s, run_dir=Path("run"))
        calls.clear()
        train._late_base_model(run)
        return log.added, run.skipped, list(calls)

    assert late(cached=True, elapsed_s=990.0) == ([(0, ["no_adapter"])], [], [False])  # cached: free
    assert late(cached=False, elapsed_s=840.0) == ([(0, ["no_adapter"])], [], [False, True])  # 840 + 1.5 x 100 fits
    assert late(cached=False, elapsed_s=890.0) == ([], ["base model"], [False])  # one condition's 100 s would fit: not enough alone
    assert late(cached=False, elapsed_s=0.0, rows=[{"condition": "no_adapter"}]) == ([], [], [])  # scored at step 0
    assert late(cached=False, elapsed_s=0.0, baselines=False) == ([], [], [])


def test_resume_does_not_redo_a_validation_deadline_skipped(monkeypatch):
    """A periodic validation deadline_s skipped is in the checkpoint (RunState.skipped_steps): a resume
    redoes only one that was interrupted."""
    import types

    import engine.commands.train as train
    from engine.commands.train_checkpoint import RunState

    redone = []
    monkeypatch.setattr(train, "validate_held_out", lambda run, step, conds: redone.append(step))
    monkeypatch.setattr(train, "mean_ref", lambda run, g: None)
    monkeypatch.setattr(train, "save_checkpoint", lambda run, progress: None)
    cfg = train_cfg("eval.every=5", "generations=10", "deadline_s=1000")
    for skipped, expect in (([5], []), ([], [5])):
        run = types.SimpleNamespace(cfg=cfg, ckpt={}, state=RunState(generation=4, skipped_steps=list(skipped)),
                                    validation=types.SimpleNamespace(has_step=lambda step: False),
                                    evaluator=types.SimpleNamespace(release=lambda g: None))
        redone.clear()
        train.baselines(run, progress=None)
        assert redone == expect


def test_a_placebo_at_a_fixed_n_validates():
    """The fix the placebo's message names works: the placebo with fixed N (and with the other levers) runs."""
    for extra in ([], ["rollout.fitness=likelihood"], ["rollout.dense=tiebreak"], ["strategy.population_size=2"]):
        validate(train_cfg("rollout.placebo=true", "rollout.adaptive_prompts=false", *extra))


@pytest.mark.parametrize("argv,expect", [(["trian", "seed=1"], "did you mean essa train?"),
                                         (["evl"], "did you mean essa eval?"),
                                         (["foo"], "'foo' is not a command of essa")])
def test_a_mistyped_command_is_named_not_parsed_as_an_override(argv, expect, capsys):
    """``essa trian seed=1`` said Hydra's "Error parsing override 'trian' missing EQUAL"; now one line naming
    the word, the commands and the nearest one."""
    from engine.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("essa: error:") and expect in err[0] and "EQUAL" not in err[0], err


@pytest.mark.parametrize("argv", [["help"], ["train", "--cfg", "job"], ["train", "--help"]])
def test_output_into_a_closed_pipe_ends_quietly(argv):
    """``essa help | head -1``: a reader that stops early closes the pipe; essa stops without a
    BrokenPipeError traceback (nor Python's 'Exception ignored' on the final flush)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    read, write = os.pipe()
    os.close(read)  # nobody reads: the first write fails with EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "engine.cli", *argv], stdout=write, stderr=subprocess.PIPE,
                              env=env, timeout=120, text=True)
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 141, proc.stderr  # 128 + SIGPIPE, as a C tool killed by it


@pytest.mark.parametrize("overrides, expect", [
    (["strategy=openai_es", "strategy.options.optimizer=bogus"],
     "strategy.options.optimizer must be 'sgd' or 'adam' (got 'bogus') (OpenAIES)"),
    (["strategy.options.diagonal=maybe"], "strategy.options.diagonal must be true, false or 'auto' (got 'maybe') (CMAES)"),
    (["strategy=randopt", "strategy.options.top_k=0"], "strategy.options.top_k must be an integer in [1, 16] (got 0)"),
])
def test_an_option_the_class_rejects_is_named_without_the_options_dict(overrides, expect):
    """The class's own line names the option: the whole strategy.options={...} dict is not dumped in front
    of it (break-it pass: 'strategy.options={'lr': None, 'optimizer': 'bogus', ...}: OpenAIES rejects them (...)')."""
    from engine.search import check_strategy_options
    from strategies import get_strategy

    cfg = train_cfg(*overrides)
    with pytest.raises(ConfigError) as e:
        check_strategy_options(get_strategy(cfg.strategy.name), cfg.strategy, 0)
    assert str(e.value).startswith(expect.split(" (got")[0]) and expect in str(e.value), str(e.value)
    assert "strategy.options={" not in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("command", ["train", "grpo", "eval", "bench"])
@pytest.mark.parametrize("seed", [-1, 2 ** 32])
def test_a_seed_numpy_and_vllm_refuse_is_refused_before_anything_loads(command, seed):
    """vLLM's workers seed numpy with the engine seed (np.random.seed: 0 <= seed < 2**32), and essa eval's
    bootstrap seeds numpy.random.default_rng (>= 0): ``essa eval seed=-1 n=4`` ran both decoding passes and then
    failed with 'expected non-negative integer', writing nothing; seed=2**32 passed every check and would
    fail at the engine's start (train: after the warm start). Each command's validate refuses both now."""
    import importlib

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name=command, overrides=[f"seed={seed}"] + (["n=4"] if command == "eval" else []))
    with pytest.raises(ConfigError) as e:
        importlib.import_module(f"engine.commands.{command}_config").validate(cfg)
    assert str(e.value).startswith(f"seed={seed}: must be an integer in [0, 4294967295]") and "e.g. seed=" in str(e.value)
