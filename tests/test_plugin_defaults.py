"""A plugin's lab answer is about the run it will do (issue 46), without an engine.

- one rule for the config fields a plugin leaves out: they come from strategy=essa's conf (genome alpha
  0.125, mode relative), options from the plugin alone; the same in essa train (its composed config and
  the genome codec it builds), essa lab (the D each setting searches, in lab_summary.json) and ``--cfg
  job`` (the printed config and the strategy/genome line);
- ``--cfg job`` loads the plugin and refuses as the run does;
- the messages: a population size the class refuses names ``strategy.population_size`` with a size that
  works, an option the class lacks lists the options it takes, ``essa lab strategy.name=<plugin>`` names
  ``strategy=<plugin>``, the lab's table keeps whole labels.
The example plugin as an installed package, end to end: tests/test_plugin_package.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from hydra import compose, initialize_config_dir

from engine.commands import register_configs
from engine.config import CONF_DIR, ConfigError

REPO = Path(__file__).resolve().parent.parent
ESSA = str(Path(sys.executable).parent / "essa")
PLUGINS = REPO / "tests" / "fixtures" / "plugin_defaults"
ENTRY_POINTS = """[essa.strategies]
minimal_es = essa_defaults_plugins:MinimalES
half_es = essa_defaults_plugins:HalfES
mirror_es = essa_defaults_plugins:MirrorES
broken_es = essa_no_such_module_46:Nope
"""
# SmolLM2-135M-Instruct's config.json shapes (the default model): 30 layers, q/o 576 -> 576, k/v 576 -> 192
SMOLLM2 = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
           "num_hidden_layers": 30}
# the lab's smallest minibatch landscape at the genome's own D
LAB_TINY = ["landscape.prompts=8", "+landscape.options.pool=200", "+landscape.options.held_out=60",
            "+landscape.options.features=16", "generations=1", "n_seeds=1", "progress=false"]


@pytest.fixture
def plugins_site(tmp_path_factory) -> Path:
    """A folder holding the fixture plugins' dist-info (what pip writes) beside their module."""
    site = tmp_path_factory.mktemp("site")
    dist = site / "essa_defaults_plugins-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: essa-defaults-plugins\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    (site / "essa_defaults_plugins.py").write_text((PLUGINS / "essa_defaults_plugins.py").read_text())
    return site


@pytest.fixture
def installed(plugins_site, monkeypatch):
    """The fixture plugins importable and registered as ``strategy=`` options in this process (their
    ConfigStore entries removed afterwards, so later tests list only the real options)."""
    from hydra.core.config_store import ConfigStore

    monkeypatch.syspath_prepend(str(plugins_site))
    monkeypatch.delitem(sys.modules, "essa_defaults_plugins", raising=False)
    register_configs()
    yield plugins_site
    group = ConfigStore.instance().repo.get("strategy", {})
    for line in ENTRY_POINTS.splitlines()[1:]:
        group.pop(f"{line.split(' = ')[0]}.yaml", None)


@pytest.fixture
def smollm2_dir(tmp_path) -> Path:
    """A model directory whose config.json has the default model's shapes (``--cfg job`` reads only that)."""
    d = tmp_path / "smollm2-shapes"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(SMOLLM2))
    return d


def compose_train(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides), return_hydra_config=True)


def genome_of(cfg) -> dict:
    return {k: cfg.strategy.genome[k] for k in ("kind", "alpha", "mode")}


def smollm2_lora(rank: int = 8) -> dict:
    from tests.helpers import random_lora

    return random_lora(SimpleNamespace(**SMOLLM2), seed=0, rank=rank)


def essa_cli(*argv: str, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([ESSA, *argv], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)


# --- train: the composed config and the genome the run builds ---------------------------------------------

def test_train_left_out_fields_come_from_strategy_essa(installed):
    essa = compose_train()
    minimal = compose_train("strategy=minimal_es")
    assert genome_of(minimal) == genome_of(essa) == {"kind": "svd_lora", "alpha": 0.125, "mode": "relative"}
    assert (minimal.strategy.population_size, minimal.strategy.sigma0) == (12, 0.2)  # its own fields
    assert dict(minimal.strategy.options) == {}  # options are the class's own: not essa's diagonal
    half = compose_train("strategy=half_es")
    assert genome_of(half) == {"kind": "svd_lora", "alpha": 0.5, "mode": "relative"}  # not the schema's additive


def test_train_builds_the_same_genome_as_strategy_essa(installed):
    from engine.search import build_search, strategy_class

    lora = smollm2_lora()
    dims = {}
    for option in ("essa", "minimal_es", "half_es"):
        s = compose_train(f"strategy={option}").strategy
        codec, strategy = build_search(s, lora, 0, strategy_class(s))
        dims[option] = (codec.dim, codec.mode, strategy.dim)
    assert dims == {"essa": (240, "relative", 240), "minimal_es": (240, "relative", 240),
                    "half_es": (960, "relative", 960)}  # D = 30 layers x 4 modules x 2 factors x floor(alpha 8)


def test_train_start_line_names_the_genome_and_d(installed):
    from engine.search import search_line, strategy_class

    for option, d in (("essa", 240), ("minimal_es", 240), ("half_es", 960)):
        cfg = compose_train(f"strategy={option}")
        line = search_line(cfg.strategy, strategy_class(cfg.strategy), cfg.lora, SMOLLM2)
        assert "\n" not in line and f"mode relative): D {d} = 30 layers x 4 modules x 2 factors" in line, line


# --- lab: the D each setting searches -------------------------------------------------------------------

def test_lab_searches_each_settings_run_genome(installed, tmp_path, capsys):
    from engine.cli import main

    out = tmp_path / "lab"
    main(["lab", *LAB_TINY, "compare=[{strategy:essa},{strategy:minimal_es},{strategy:half_es}]",
          f"hydra.run.dir={out}"])
    settings = json.loads((out / "lab_summary.json").read_text())["settings"]
    assert [s["dim"] for s in settings] == [240, 240, 960]
    for s in settings:
        g = s["genome"]
        assert g["run_dim"] == g["dim"] == s["dim"] and g["as_run"] and g["note"] is None, g
        assert (g["kind"], g["mode"]) == ("svd_lora", "relative")
    assert [s["genome"]["alpha"] for s in settings] == [0.125, 0.125, 0.5]


def test_lab_warns_in_one_line_naming_both_dimensions(installed, tmp_path, capsys):
    from engine.cli import main

    out = tmp_path / "lab"
    main(["lab", *LAB_TINY, "strategy=half_es", "landscape.dim=240", f"hydra.run.dir={out}"])
    g = json.loads((out / "lab_summary.json").read_text())["settings"][0]["genome"]
    assert (g["run_dim"], g["dim"], g["as_run"]) == (960, 240, False)
    logged = capsys.readouterr().out.splitlines()  # Hydra's job logging writes to stdout
    warned = [ln for ln in logged if "[WARNING]" in ln and "landscape.dim=240" in ln]
    assert len(warned) == 1 and "D 240" in warned[0] and "D 960" in warned[0], warned


def test_lab_refuses_a_genome_the_simulator_cannot_search(tmp_path, capsys):
    from engine.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["lab", *LAB_TINY, "strategy=sep_cma", f"hydra.run.dir={tmp_path / 'lab'}"])  # genome kind lora
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exc.value.code == 2 and len(err) == 1, err
    assert "D 921600" in err[0] and "D 240" in err[0] and "landscape.dim" in err[0], err[0]


# --- --cfg job: the plugin's real config, or the run's refusal ---------------------------------------------

@pytest.mark.parametrize("option, d, alpha", [("minimal_es", 240, 0.125), ("half_es", 960, 0.5)])
def test_cfg_job_shows_the_genome_the_run_searches(plugins_site, smollm2_dir, option, d, alpha):
    proc = essa_cli("train", f"strategy={option}", f"model.path={smollm2_dir}", "--cfg", "job", site=plugins_site)
    assert proc.returncode == 0, proc.stderr[-2000:]
    shown = yaml.safe_load(proc.stdout)["strategy"]
    essa = yaml.safe_load(essa_cli("train", "--cfg", "job", site=plugins_site).stdout)["strategy"]
    assert shown["genome"] == {**essa["genome"], "alpha": alpha}  # essa's genome, the plugin's alpha
    assert shown["options"] == {}
    line = [ln for ln in proc.stderr.splitlines() if f"strategy {option} (essa_defaults_plugins." in ln]
    assert len(line) == 1 and f"alpha {alpha:g}, mode relative): D {d} =" in line[0], proc.stderr[-2000:]
    lab = essa_cli("lab", f"strategy={option}", "--cfg", "job", site=plugins_site)
    assert lab.returncode == 0 and f"minibatch landscape at D {d}" in lab.stderr, lab.stderr[-2000:]


def test_cfg_job_refuses_a_plugin_that_does_not_import(plugins_site):
    proc = essa_cli("train", "strategy=broken_es", "--cfg", "job", site=plugins_site)
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-2000:]
    assert err[0].startswith("essa: error: strategy.name='broken_es'") and "does not load" in err[0], err[0]
    assert proc.stdout == ""  # no config printed: the run would not start


def test_cfg_job_refuses_a_name_over_other_options(plugins_site):
    proc = essa_cli("train", "strategy.name=minimal_es", "--cfg", "job", site=plugins_site)
    assert proc.returncode == 2 and "select it with its own config: strategy=minimal_es" in proc.stderr, proc.stderr


# --- messages -------------------------------------------------------------------------------------------

def test_population_size_refusal_names_the_field_and_a_size_that_works(installed):
    from engine.search import check_strategy_options, strategy_class

    cfg = compose_train("strategy=mirror_es", "strategy.population_size=15")
    cls = strategy_class(cfg.strategy)
    with pytest.raises(ConfigError) as e:
        check_strategy_options(cls, cfg.strategy, 0)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("strategy.population_size=15: MirrorES rejects it"), msg
    assert "strategy.options" not in msg and msg.endswith("e.g. strategy.population_size=16"), msg
    fixed = compose_train("strategy=mirror_es", "strategy.population_size=16")
    check_strategy_options(cls, fixed.strategy, 0)  # the suggested size passes


def test_unknown_option_lists_the_options_the_class_takes():
    from engine.search import check_strategy_options, strategy_class

    cfg = compose_train("strategy=openai_es", "+strategy.options.learning_rate=1")
    with pytest.raises(ConfigError) as e:
        check_strategy_options(strategy_class(cfg.strategy), cfg.strategy, 0)
    msg = str(e.value)
    assert msg.startswith("strategy.options.learning_rate: OpenAIES takes no such option"), msg
    assert "its options: lr, optimizer, weight_decay" in msg and "~strategy.options.learning_rate" in msg, msg


def test_lab_strategy_name_of_a_plugin_gives_the_group_option(installed, tmp_path, capsys):
    from engine.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["lab", *LAB_TINY, "strategy.name=minimal_es", f"hydra.run.dir={tmp_path / 'lab'}"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exc.value.code == 2 and len(err) == 1, err
    assert "select it with its own config: strategy=minimal_es" in err[0], err[0]


def test_lab_table_keeps_whole_labels(tmp_path, capsys):
    from engine.cli import main

    label = "strategy.population_size=16, strategy.sigma0=0.1"  # 49 characters: was cut at 40
    main(["lab", *LAB_TINY, f"compare=[{{}},{{strategy.population_size:16,strategy.sigma0:0.1}}]",
          f"hydra.run.dir={tmp_path / 'lab'}"])
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("strategy.population_size")]
    assert len(rows) == 1 and rows[0].startswith(label + " "), rows
