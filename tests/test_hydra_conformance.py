"""`essa <command>` against a plain ``@hydra.main`` app on the same conf/: Hydra's documented command line
is the CLI's contract (issue 38).

Each row of :data:`ROWS` runs through both, in-process, with ``--cfg job``: where the plain app
composes, essa prints the same config; where it refuses, essa refuses too, in one line naming the
field and a fix (and the fix, where it is a command line, composes in both). Sweeps run for real
through both with a task function that only records each job's config. A user config folder
(``-cd``, ``hydra.searchpath``) is made in a temp dir. Shell completion is queried through bash.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import hydra
import pytest
from omegaconf import OmegaConf

from engine.config import CONF_DIR

REPO = Path(__file__).resolve().parent.parent
USER = "USERCONF"  # replaced by the temp user config folder


@pytest.fixture
def userconf(tmp_path, monkeypatch):
    """A user's own config folder: a strategy option over a built-in one, an experiment that selects a
    built-in strategy, a primary config on top of train's. The tests run in ``tmp_path``."""
    d = tmp_path / "userconf"
    (d / "strategy").mkdir(parents=True)
    (d / "experiment").mkdir()
    (d / "strategy" / "mine.yaml").write_text("defaults:\n  - essa\n  - _self_\noptions:\n  ties: argsort\n")
    (d / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /strategy: openai_es\ngenerations: 3\n")
    (d / "mytrain.yaml").write_text("defaults:\n  - train\n  - _self_\ngenerations: 4\n")
    # a sweep set in a config file (hydra.sweeper.params, which the sweeper puts before the command line's)
    for name, params in (("sweep_ok", "seed: 0,1"), ("sweep_typo", "genrations: 1,2"),
                         ("sweep_badvalue", "strategy.population_size: 4,abc")):
        (d / f"{name}.yaml").write_text(f"defaults:\n  - train\n  - _self_\nhydra:\n  sweeper:\n    params:\n"
                                        f"      {params}\n")
    monkeypatch.chdir(tmp_path)
    return d


def _argv(argv: list[str], userconf: Path) -> list[str]:
    return [a.replace(USER, str(userconf)) for a in argv]


def register_plain() -> None:
    """What a plain app on conf/ registers: the commands' schemas and the Optuna sweeper's default."""
    from engine.commands import register_configs
    from engine.results.sweeps import register_sweeper_defaults

    register_configs()
    register_sweeper_defaults()


def run_plain(config_name: str, argv: list[str], capsys) -> tuple[int, str, str]:
    """A plain ``@hydra.main`` app on conf/ (with essa's ConfigStore entries): (exit status, out, err)."""
    register_plain()

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=config_name)
    def app(cfg):
        return None

    capsys.readouterr()
    old = sys.argv
    sys.argv = ["plain_app.py", *argv]
    code = 0
    try:
        app()
    except SystemExit as e:
        code = e.code or 0
    except ValueError:  # Hydra refuses a combination of flags with a traceback
        code = 1
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return code, out, err


def run_essa(argv: list[str], capsys) -> tuple[int, str, str]:
    """``essa <argv>`` in-process: (exit status, out, err)."""
    from engine.cli import main

    capsys.readouterr()
    code = 0
    try:
        main(argv)
    except SystemExit as e:
        code = e.code or 0
    out, err = capsys.readouterr()
    return code, out, err


# (command, overrides and flags (always with --cfg job), for a refusal: what essa's one line says)
ROWS = [
    ("train", [], None),
    ("train", ["task=gsm8k", "strategy=openai_es", "strategy.options.optimizer=adam"], None),
    # a user config folder: its own strategy option and the fields that option has (issue 38 case 2)
    ("train", ["-cd", USER, "strategy=mine", "strategy.options.ties=average"], None),
    ("train", ["--config-dir", USER, "strategy=mine", "strategy.sigma0=0.2"], None),
    # a user experiment that selects a built-in strategy: that strategy's options
    ("train", ["-cd", USER, "+experiment=mine", "strategy.options.optimizer=adam"], None),
    ("train", [f"hydra.searchpath=[file://{USER}]", "strategy=mine", "strategy.options.ties=average"], None),
    ("train", ["-cd", USER, "--config-name", "mytrain", "strategy.sigma0=0.2"], None),
    ("train", ["-cd", USER, "-cn", "mytrain", "genrations=3"], "did you mean generations=3?"),
    ("lab", ["-cd", USER, "strategy=mine", "strategy.options.ties=average"], None),
    ("eval", ["task=svamp", "n=4"], None),
    # a dict on an existing dict field: the '+' form (issue 38 case 4)
    ("train", ["task.gym.options={max_terms:4}"], "add new keys with '+': +task.gym.options={max_terms:4}"),
    ("train", ["+task.gym.options={max_terms:4}"], None),
    ("lab", ["landscape.options={chaos:0.4}"], "add new keys with '+': +landscape.options={chaos:0.4}"),
    ("lab", ["+landscape.options={chaos:0.4}"], None),
    # today's one-line refusals, kept
    ("train", ["genrations=3"], "genrations: no such field; did you mean generations=3?"),
    ("train", ["strategy.sigma00=0.3"], "strategy.sigma00: no such field; did you mean strategy.sigma0=0.3?"),
    ("train", ["strategy.population_size=abc"], "strategy.population_size=abc"),
    ("train", ["task=nope"], "no config 'task/nope'; available: arithmetic"),
    ("train", ["-cd", USER, "strategy=nope"], ", mine, "),
    ("train", ["strategy.options.ties=argsort"], "a new key of strategy.options; add it with '+': +strategy.options.ties="),
    ("train", ["+strategy.options.ties=argsort"], None),
    ("train", ["-cd", USER, "strategy=mine", "+strategy.options.ties=argsort"], "drop the '+'"),
    ("train", ["-cd", USER, "genrations=3"], "genrations: no such field; did you mean generations=3?"),
    ("train", ["experiment=tiny"], "add it with '+': +experiment=tiny"),
    ("train", ["strategy.sigma0=0.1,0.2"], "add -m to sweep"),
    ("train", ["hydra.mode=MULTIRUN", "strategy.sigma0=0.1,0.2"], "add -m to sweep"),  # --cfg shows one run
    # a strategy option the class does not take: the options it takes, not a '+' that fails later (issue 46)
    ("train", ["strategy.options.learning_rate=1"], "takes no option 'learning_rate'"),
    ("train", ["strategy=openai_es", "strategy.options.learning_rate=1"], "its options: lr, optimizer, weight_decay"),
]


@pytest.mark.parametrize("command, argv, refusal", ROWS, ids=[" ".join([r[0], *r[1]]) for r in ROWS])
def test_essa_composes_what_hydra_composes_and_refuses_what_it_refuses(command, argv, refusal, userconf, capsys):
    from engine.commands import COMMANDS

    argv = _argv(["--cfg", "job", *argv], userconf)
    p_code, p_out, p_err = run_plain(COMMANDS[command].yaml, argv, capsys)
    e_code, e_out, e_err = run_essa([command, *argv], capsys)
    if refusal is None:
        assert p_code == 0, p_err
        assert e_code == 0 and e_out == p_out, e_err
        return
    assert p_code != 0, p_out
    lines = [ln for ln in e_err.splitlines() if ln.strip()]
    assert e_code == 2 and len(lines) == 1 and lines[0].startswith("essa: error: "), e_err
    assert refusal in lines[0], lines[0]


@pytest.mark.parametrize("argv, refusal", [
    (["-m", "genrations=3,4"], "genrations: no such field; did you mean generations=3,4?"),
    (["-m", "-cd", USER, "genrations=3,4"], "did you mean generations=3,4?"),
    (["hydra.mode=MULTIRUN", "strategy.sigma00=0.1,0.2"], "did you mean strategy.sigma0=0.1,0.2?"),
    (["-m", "strategy.population_size=4,abc"], "strategy.population_size=abc"),
    (["-m", "strategy=essa,openai_es", "strategy.options.diagonal=true"], "strategy.options.diagonal"),
    (["-m", "-cd", USER, "strategy=nope,mine"], "no config 'strategy/nope'"),
    (["-m", "hydra/sweeper=optuna", "strategy.sigmaa=interval(0.05,0.3)"], "did you mean strategy.sigma0"),
    (["--cfg", "job", "-m", "genrations=3"], "only one of --run, --multirun, --cfg and --info"),
    (["--resolve"], "--resolve"),
    # a sweep in hydra.sweeper.params of a config file: its jobs are checked like the command line's
    (["-m", "-cd", USER, "-cn", "sweep_typo"], "genrations: no such field"),
    (["-m", "-cd", USER, "-cn", "sweep_badvalue"], "strategy.population_size=abc"),
    (["-cd", USER, "-cn", "sweep_typo", "hydra.mode=MULTIRUN"], "genrations: no such field"),
    # hydra.sweeper.params is null in essa's config: Hydra fails with an AttributeError/AssertionError trace
    (["-m", "hydra.sweeper.params.seed='0,1'"], "hydra.sweeper.params is null in this config"),
    (["-m", "++hydra.sweeper.params.seed='0,1'"], "hydra.sweeper.params is null in this config"),
    (["-m", "hydra.sweeper.params={seed:'0,1'}"], "hydra.sweeper.params is null in this config"),
])
def test_sweeps_hydra_refuses_are_refused_in_one_line(argv, refusal, userconf, capsys):
    argv = _argv(argv, userconf)
    assert run_plain("train", argv, capsys)[0] != 0
    code, _, err = run_essa(["train", *argv], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and refusal in lines[0], err


@pytest.mark.parametrize("argv", [
    ["hydra.mode=MULTIRUN", "strategy.sigma0=0.1,0.2"],                       # issue 38 case 3
    ["-m", "-cd", USER, "strategy=mine,cma_es", "strategy.sigma0=0.2"],       # a sweep over a user's own option
    ["-m", f"hydra.searchpath=[file://{USER}]", "strategy=mine", "strategy.options.ties=average,argsort"],
    ["-m", "+hydra.job.env_set.ESSA_TEST_FLAG=1", "seed=0,1"],  # a '+hydra...' addition is the master's, not each job's
    ["-m", "-cd", USER, "-cn", "sweep_ok"],                               # the sweep of hydra.sweeper.params
    ["-m", "-cd", USER, "-cn", "sweep_ok", "hydra.sweeper.params.seed='5,6'"],
])
def test_sweeps_run_the_jobs_hydra_runs(argv, userconf, capsys, monkeypatch, tmp_path):
    """A sweep runs the same jobs with the same configs through essa (its job function faked) and the
    plain app; every job logs to <job dir>/train.log (issue 38 case 6)."""
    from engine.cli import hydra_app

    register_plain()
    seen: dict[str, list[str]] = {"essa": [], "plain": []}
    monkeypatch.setattr(hydra_app, "run_job", lambda command, cfg: seen["essa"].append(OmegaConf.to_yaml(cfg)) or 0.5)

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
    def app(cfg):
        seen["plain"].append(OmegaConf.to_yaml(cfg))

    argv = _argv(argv, userconf)
    monkeypatch.setattr(sys, "argv", ["plain_app.py", *argv, f"hydra.sweep.dir={tmp_path / 'plain'}"])
    app()
    code, _, err = run_essa(["train", *argv, f"hydra.sweep.dir={tmp_path / 'essa'}"], capsys)
    assert code == 0, err
    assert len(seen["essa"]) == 2 and seen["essa"] == seen["plain"]
    assert sorted(p.name for p in (tmp_path / "essa").glob("*/*.log")) == ["train.log", "train.log"]


def test_logging_prints_once_and_the_version_once(capsys):
    """``--info`` and ``--version`` print once (issue 38 case 5: a root handler of the CLI's own beside
    Hydra's repeated --info on stderr; the override check printed --version too). --info runs in a
    fresh process: in pytest's, the root logger already has pytest's handler."""
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "train", "--info", "searchpath"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, timeout=120)
    assert proc.returncode == 0 and (proc.stdout + proc.stderr).count("Config search path") == 1, proc.stderr
    code, out, err = run_essa(["eval", "--version"], capsys)
    assert code == 0 and (out + err).count("Hydra 1.") == 1, out + err


def test_job_and_help_are_named_after_the_command_and_list_its_groups(userconf, capsys):
    """Issue 38 case 6 and each command's --help: its name, its groups (options from -cd too), no other's."""
    code, out, _ = run_essa(["eval", "--cfg", "hydra"], capsys)
    assert code == 0 and OmegaConf.create(out).hydra.job.name == "eval"
    code, out, _ = run_essa(["eval", "--help"], capsys)
    groups = out.split("== Configuration groups of essa eval ==")[1].split("==")[0]
    assert code == 0 and out.startswith("essa eval: ") and "hydra_app" not in out
    assert [ln.split(":")[0] for ln in groups.strip().splitlines()] == ["engine", "model", "reward", "task"]
    code, out, _ = run_essa(["train", "-cd", str(userconf), "--help"], capsys)
    assert code == 0 and out.startswith("essa train: ") and "Hydra (https://hydra.cc)" in out
    strategy = next(ln for ln in out.splitlines() if ln.startswith("strategy: "))
    assert "cma_es, corp, essa, " in strategy and ", mine, " in strategy and strategy.endswith(" (now essa)"), strategy
    assert "experiment (add with +experiment=option): mine, tiny" in out


@pytest.mark.parametrize("line, expect, absent", [
    ("essa train stra", "strategy=", None),
    ("essa train strategy=", "strategy=essa", None),
    ("essa stra", "strategy=", None),                                   # train is the default command
    ("essa tr", "train", None),                                         # the first word: a command
    ("essa eval task=", "task=gsm8k", None),
    ("essa train -cd USERCONF strategy=", "strategy=mine", None),       # the line's own config folder
    ("essa report ", None, "strategy"),                                 # report takes no overrides
])
@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_query_answers_for_a_command(shell, line, expect, absent, userconf, capsys, monkeypatch):
    monkeypatch.setenv("COMP_LINE", line.replace(USER, str(userconf)))
    code, out, err = run_essa(["-sc", f"query={shell}"], capsys)
    assert code == 0, err
    words = out.split()
    if expect:
        assert any(w.startswith(expect) for w in words), out
    if absent:
        assert not any(absent in w for w in words), out


def test_bash_completion_installs_and_answers(tmp_path):
    """``eval "$(essa train -sc install=bash)"`` registers completion for ``essa``, and the registered
    function answers ``essa train stra<TAB>`` and ``essa train strategy=<TAB>`` (issue 38 case 1)."""
    essa = shutil.which("essa", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if essa is None or shutil.which("bash") is None:
        pytest.skip("needs the essa script and bash")
    script = r'''
eval "$(essa train -sc install=bash)"
complete -p essa
for line in "essa train stra" "essa train strategy="; do
  COMP_LINE="$line"; COMP_POINT=${#line}; read -ra COMP_WORDS <<< "$line"; COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
  hydra_bash_completion; echo "REPLY ${COMPREPLY[*]}"
done
'''
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{Path(essa).parent}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=120).stdout
    lines = out.splitlines()
    assert any(ln.startswith("complete ") and ln.endswith(" essa") for ln in lines), out
    replies = [ln.split()[1:] for ln in lines if ln.startswith("REPLY")]
    assert "strategy=" in replies[0] and {"strategy=essa", "strategy=openai_es"} <= set(replies[1]), out


@pytest.mark.parametrize("argv", [["-sc", "install=bash"], ["--shell-completion", "install=zsh"],
                                  ["-sc", "install=fish"], ["-sc", "uninstall=bash"]])
def test_completion_install_is_not_read_as_overrides(argv, capsys):
    code, out, err = run_essa(["train", *argv], capsys)
    assert code == 0 and "error" not in err and "hydra_" in out, err
    assert "essa train" not in out and ("essa" in out or "uninstall" in argv[1])  # completes essa, not "essa train"
