"""Sweeps and strategy plugins the Hydra way (issue 12), without an engine.

- a strategy plugin registered under ``essa.strategies`` is a ``strategy=`` group option with its
  own settings, and picking it by ``strategy.name=`` / ``_target_`` over another strategy's options
  names the override that fixes it;
- ``essa train -m`` with failing jobs: every job runs, each failure is recorded in its job directory,
  the process exits non-zero naming all of them, and a job directory passes back to the CLI unquoted
  (console script, real Hydra; the jobs fail in validation, before any model is loaded);
- ``essa report multirun/<time>``: one table of all jobs, best first, and overlaid figures.
The real sweeps (Optuna, Ray launcher) and the installed plugin package: tests/test_sweeps_integration.py.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from engine.config import CONF_DIR
from engine.commands import register_configs
from engine.config import ConfigError

REPO = Path(__file__).resolve().parent.parent
ESSA = str(Path(sys.executable).parent / "essa")
PLUGIN_DIR = REPO / "tests" / "plugin_example"
FIXTURE_RUN = REPO / "tests" / "fixtures" / "run_small"


def compose_train(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides), return_hydra_config=True)


@pytest.fixture
def plugin_module(monkeypatch):
    """The example plugin importable by dotted path (no entry point)."""
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))


@pytest.fixture
def plugin_entry_point(plugin_module, tmp_path, monkeypatch):
    """The example plugin as an installed distribution: a dist-info with its entry point (what pip
    writes), then the CLI's ConfigStore registration."""
    dist = tmp_path / "essa_plugin_example-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: essa-plugin-example\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[essa.strategies]\nrandom_search = essa_plugin_example:RandomSearch\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    register_configs()


def test_plugin_is_a_group_option_with_its_own_config(plugin_entry_point):
    from essa_plugin_example import RandomSearch

    cfg = compose_train("strategy=random_search")
    own = RandomSearch.config
    assert cfg.strategy.name == "random_search" and cfg.hydra.runtime.choices.strategy == "random_search"
    assert cfg.strategy.sigma0 == own["sigma0"] and cfg.strategy.population_size == own["population_size"]
    assert cfg.strategy.genome.alpha == own["genome"]["alpha"]
    assert dict(cfg.strategy.options) == {}  # not essa's diagonal option
    assert cfg.strategy.genome.mode == "relative"  # a field the plugin leaves out: strategy=essa's (issue 46)


@pytest.mark.parametrize("override", ["strategy.name=random_search",
                                      "strategy._target_=essa_plugin_example.RandomSearch"])
def test_name_or_target_over_other_options_gives_the_group_option(plugin_entry_point, override):
    from engine.search.plugins import check_strategy_choice

    cfg = compose_train(override)
    with pytest.raises(ConfigError) as e:
        check_strategy_choice(cfg.strategy, cfg.seed, cfg.hydra.runtime.choices.strategy)
    msg = str(e.value)
    assert "\n" not in msg and override in msg and "strategy=random_search" in msg, msg


def test_target_without_group_option_gives_the_keys_to_drop(plugin_module):
    from engine.search.plugins import check_strategy_choice

    cfg = compose_train("strategy._target_=essa_plugin_example.RandomSearch")
    with pytest.raises(ConfigError, match=r"drop them: ~strategy\.options\.diagonal$"):
        check_strategy_choice(cfg.strategy, cfg.seed, cfg.hydra.runtime.choices.strategy)
    fixed = compose_train("strategy._target_=essa_plugin_example.RandomSearch", "~strategy.options.diagonal")
    check_strategy_choice(fixed.strategy, fixed.seed, fixed.hydra.runtime.choices.strategy)  # the suggested fix passes


def test_built_in_choice_and_compatible_name_pass():
    from engine.search.plugins import check_strategy_choice

    for overrides in ((), ("strategy=sep_cma",), ("strategy.name=cma_es",)):  # cma_es takes essa's options
        cfg = compose_train(*overrides)
        check_strategy_choice(cfg.strategy, cfg.seed, cfg.hydra.runtime.choices.strategy)
    cfg = compose_train("strategy.name=sep_cma")  # sep_cma rejects diagonal=false and has its own option
    with pytest.raises(ConfigError, match="strategy=sep_cma"):
        check_strategy_choice(cfg.strategy, cfg.seed, cfg.hydra.runtime.choices.strategy)


# --- multirun through the console script --------------------------------------------------------

@pytest.fixture(scope="module")
def failed_sweep(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("sweep") / "multirun"
    proc = subprocess.run([ESSA, "train", "-m", "strategy.sigma0=-1,-2", f"hydra.sweep.dir={sweep}"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    return sweep, proc


def test_every_failed_job_is_recorded_and_the_sweep_goes_on(failed_sweep):
    sweep, proc = failed_sweep
    assert proc.returncode == 1, proc.stderr[-3000:]
    for job, value in (("0", "-1"), ("1", "-2")):  # job 1 ran although job 0 failed
        error = (sweep / job / "error.txt").read_text().strip()
        assert error.startswith(f"strategy.sigma0={value}") and "must be > 0" in error, error
        assert f"strategy.sigma0={value}" in yaml.safe_load((sweep / job / ".hydra" / "overrides.yaml").read_text())
    err = proc.stderr
    assert "essa: error: 2 of 2 sweep jobs failed" in err, err[-3000:]
    assert "job 0 (strategy.sigma0=-1): strategy.sigma0=-1" in err and "job 1 (strategy.sigma0=-2):" in err
    assert "Traceback" not in err


def test_job_dirs_pass_back_to_the_cli_unquoted(failed_sweep):
    sweep, _ = failed_sweep
    assert sorted(p.name for p in sweep.iterdir() if (p / ".hydra").is_dir()) == ["0", "1"]
    proc = subprocess.run([ESSA, "train", f"resume={sweep / '0'}", "hydra.run.dir=" + str(sweep / "r")], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("essa: error:")]
    # Hydra parses the path; the run then stops on the job's missing checkpoint, not on the override syntax.
    assert proc.returncode == 2 and len(err) == 1 and "resume: no checkpoint" in err[0], proc.stderr[-2000:]
    assert not (sweep / "r").exists()  # the refused run leaves no run directory of its own behind


def test_report_of_a_failed_sweep(failed_sweep, tmp_path):
    sweep, _ = failed_sweep
    proc = subprocess.run([ESSA, "report", str(sweep), "--out", str(tmp_path / "rep")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| 0 ") or ln.startswith("| 1 ")]
    assert len(rows) == 2 and all("failed: strategy.sigma0=" in r for r in rows), proc.stdout


# --- essa report multirun/<time> ----------------------------------------------------------------

def _job(sweep: Path, num: str, overrides: list[str], summary: dict | None = None, error: str | None = None,
         run_files: bool = False) -> Path:
    d = sweep / num
    if run_files:
        shutil.copytree(FIXTURE_RUN, d)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    if error is not None:
        (d / "error.txt").write_text(error + "\n")
    return d


def test_sweep_table_best_first_with_intervals(tmp_path):
    from engine.results.report import is_sweep_dir, load_sweep, make_sweep_report, sweep_table

    sweep = tmp_path / "multirun" / "2026-12-01_00-00-00"
    _job(sweep, "0", ["strategy.sigma0=0.1"], {"val": {"sft": 0.5, "mean": 0.25}, "wall_s": 12.5}, run_files=True)
    _job(sweep, "1", ["strategy.sigma0=-1"], error="strategy.sigma0=-1.0: must be > 0, e.g. strategy.sigma0=0.1")
    _job(sweep, "2", ["strategy.sigma0=0.2"], {"val": {"mean": 0.75}, "val_ci95": {"mean": [0.4, 0.93]},
                                              "wall_s": 30.0})
    _job(sweep, "3", ["strategy.sigma0=0.3"])  # still running / killed
    _job(sweep, "10", ["strategy.sigma0=0.4"], {"val": {"mean": 0.5}, "wall_s": 8.0})
    assert is_sweep_dir(sweep) and not is_sweep_dir(sweep / "0")

    jobs = load_sweep(sweep)
    assert [j.number for j in jobs] == ["2", "10", "0", "3", "1"]  # done by accuracy, incomplete, failed
    assert [j.status for j in jobs] == ["done", "done", "done", "incomplete", "failed"]
    table = sweep_table(jobs)
    assert table[2].startswith("| 2 | strategy.sigma0=0.2 | done | 0.750 [0.400, 0.930] | 30.0 |"), table[2]
    assert "| 0.250 |" in table[4] and "[" not in table[4]  # no interval in that summary.json
    assert "failed: strategy.sigma0=-1.0: must be > 0" in table[-1]

    paths = make_sweep_report(sweep, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md.index("| 2 | strategy.sigma0=0.2") < md.index("| 1 | strategy.sigma0=-1")
    assert "job 0: strategy.sigma0=0.1" in md  # the job with run files is in the overlaid figures
    assert any(p.name == "fitness.png" for p in paths)


def test_report_of_a_directory_without_jobs_is_one_line(tmp_path):
    from engine.results.report import cli

    with pytest.raises(SystemExit) as e:
        cli([str(tmp_path)])
    assert e.value.code == 2


def test_a_refused_run_dir_is_removed_only_when_it_holds_nothing_but_hydra_files(tmp_path):
    from engine.cli.hydra_app import remove_refused_run_dir

    refused = tmp_path / "refused"
    (refused / ".hydra").mkdir(parents=True)
    (refused / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (refused / "cli.log").write_text("")
    assert remove_refused_run_dir(refused, "cli.log") and not refused.exists()
    kept = tmp_path / "kept"  # a run that wrote something keeps its directory
    (kept / ".hydra").mkdir(parents=True)
    (kept / "run.json").write_text("{}")
    assert not remove_refused_run_dir(kept, "cli.log") and (kept / "run.json").exists()
    logs = tmp_path / "logs"  # a user's own log files beside a .hydra/: not Hydra's job log, kept
    (logs / ".hydra").mkdir(parents=True)
    (logs / "notes.log").write_text("x")
    assert not remove_refused_run_dir(logs, "cli.log") and (logs / "notes.log").exists()
    extra = tmp_path / "extra"  # something else inside .hydra/: kept
    (extra / ".hydra").mkdir(parents=True)
    (extra / ".hydra" / "mine.txt").write_text("x")
    assert not remove_refused_run_dir(extra, "cli.log") and (extra / ".hydra" / "mine.txt").exists()
    plain = tmp_path / "plain"  # not a Hydra run dir (no .hydra/): never touched
    plain.mkdir()
    assert not remove_refused_run_dir(plain, "cli.log") and plain.exists()
    assert not remove_refused_run_dir(tmp_path / "missing", "cli.log")


# --- Optuna: the direction, jobs without a value, sweeps without a completed trial (issue 29c) ------

def test_optuna_sweeper_maximises_by_default():
    """hydra-optuna-sweeper's own default is minimize; every essa command returns an accuracy."""
    from engine.results.sweeps import register_sweeper_defaults

    register_configs()
    register_sweeper_defaults()

    def direction(*overrides):  # the schema's Direction enum, or the override's string
        d = compose_train("hydra/sweeper=optuna", *overrides).hydra.sweeper.direction
        return getattr(d, "name", d)

    cfg = compose_train("hydra/sweeper=optuna", "hydra.sweeper.n_trials=4", "hydra.sweeper.sampler.seed=1")
    assert direction() == "maximize" and cfg.hydra.sweeper.n_trials == 4
    assert cfg.hydra.sweeper.sampler._target_ == "optuna.samplers.TPESampler"   # the plugin's defaults list kept
    assert direction("hydra.sweeper.direction=minimize") == "minimize"          # an explicit choice still wins
    assert "optuna" not in compose_train().hydra.sweeper._target_.lower()       # the basic sweeper is unchanged


def _run_job_returning(value, sweeper: str, tmp_path, monkeypatch):
    """``run_job`` of a fake command that returns ``value``, as job 0 of a multirun under ``sweeper``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    from engine.cli import hydra_app
    from engine.commands import COMMANDS, Command
    from engine.results.sweeps import register_sweeper_defaults

    register_configs()
    register_sweeper_defaults()
    cfg = compose_train(*(["hydra/sweeper=optuna"] if sweeper == "optuna" else []))
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.runtime.output_dir = str(tmp_path)
    HydraConfig.instance().set_config(cfg)
    monkeypatch.setitem(COMMANDS, "fake", Command("fake", "", f"{__name__}:_fake_run", "engine.commands.train_config"))
    monkeypatch.setattr(sys.modules[__name__], "_FAKE_VALUE", value)
    try:
        return hydra_app.run_job("fake", OmegaConf.create({}))
    finally:
        HydraConfig.instance().cfg = None  # no Hydra config leaks into later tests


_FAKE_VALUE = None


def _fake_run(cfg, run_dir):
    return _FAKE_VALUE


@pytest.mark.parametrize("value, sweeper, failed", [
    (None, "optuna", True),     # generations=0: no accuracy, a failed trial for Optuna, so a failed job
    (0.5, "optuna", False),
    (None, "basic", False),     # the basic sweeper ignores return values
])
def test_a_job_without_a_value_is_failed_under_optuna(value, sweeper, failed, tmp_path, monkeypatch):
    from engine.results.sweeps import NO_VALUE_LINE, failed_jobs

    assert _run_job_returning(value, sweeper, tmp_path / "0", monkeypatch) == value
    (tmp_path / "0" / ".hydra").mkdir(parents=True, exist_ok=True)
    got = failed_jobs(tmp_path)
    assert got == ([(tmp_path / "0", NO_VALUE_LINE)] if failed else [])


def test_optuna_sweep_without_a_completed_trial_names_its_jobs(tmp_path):
    """Every trial fails (here in validation, no model loaded): one line per job and exit 1, not Optuna's
    ``ValueError: No trials are completed yet.`` traceback."""
    sweep = tmp_path / "optuna"
    proc = subprocess.run([ESSA, "train", "-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1",
                           "hydra.sweeper.sampler.seed=1", "strategy.sigma0=choice(-1,-2)", f"hydra.sweep.dir={sweep}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    err = proc.stderr
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err and "No trials are completed yet" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("essa: error:")]
    assert lines == [f"essa: error: 2 of 2 sweep jobs failed (job 0, 1) in {sweep}; no trial completed, so Optuna has "
                     f"no best trial (each job's error is in <job dir>/error.txt):"], err[-3000:]
    assert "  job 0 (strategy.sigma0=" in err and "  job 1 (strategy.sigma0=" in err
    assert "Directions: ['maximize']" in proc.stdout + err
    assert not (sweep / "optimization_results.yaml").exists()
