"""The README's plugin recipe end to end (issues 12 and 46): tests/plugin_example pip-installed as a package,
as a user would (into a folder on PYTHONPATH, so the shared venv is left alone), then used through the
``essa`` console script:

- visible in ``essa train --help`` and ``essa lab --help`` as ``strategy=random_search``;
- previewed by ``--cfg job`` with its own config (P 8, sigma0 0.05, genome alpha 0.5 and strategy=essa's
  mode relative: D 960) and the line naming it;
- its own conformance test (tests/plugin_example/test_conformance.py) passes against the installed module;
- a short lab comparison against strategy=essa, each at its own genome (D 240 and D 960);
- picked by ``strategy.name=`` / ``_target_=`` over essa's options: one line naming ``strategy=random_search``;
- a tiny real run (integration: real vLLM on the CPU, the embedded model, no warm start).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
ESSA = str(Path(sys.executable).parent / "essa")
PLUGIN_SRC = REPO / "tests" / "plugin_example"
# The cheapest real run: tiny experiment (P = 4, N = 4, 32 tokens, 8 held-out problems), one generation, no
# warm start (what these tests check is the plugin machinery, not the SFT).
TINY = ["+experiment=tiny", "sft=off", "generations=1", "eval.every=0", "eval.baselines=false", "engine.kv_cache_gib=1"]


def essa(*args: str, env: dict | None = None, timeout: float = 900, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([ESSA, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})})


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict:
    """``pip install`` of the example plugin package (its pyproject.toml declares the entry point) into a
    folder put on PYTHONPATH; built from a copy so the source tree stays clean."""
    root = tmp_path_factory.mktemp("plugin")
    src = shutil.copytree(PLUGIN_SRC, root / "pkg", ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(src)], check=True, capture_output=True, text=True, timeout=300)
    assert (site / "essa_plugin_example.py").is_file() and list(site.glob("*.dist-info/entry_points.txt"))
    path = [str(site), str(REPO), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(path).rstrip(os.pathsep)}


@pytest.mark.parametrize("command", ["train", "lab"])
def test_visible_in_help(plugin_env, command):
    proc = essa(command, "--help", env=plugin_env, timeout=300)
    groups = [ln for ln in proc.stdout.splitlines() if ln.startswith("strategy: ")]
    assert proc.returncode == 0 and len(groups) == 1 and "random_search" in groups[0].split(", "), groups


def test_cfg_job_previews_its_own_config(plugin_env, tmp_path):
    model = tmp_path / "model"  # the default model's shapes, so the preview can name D without converting it
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 576, "num_attention_heads": 9, "head_dim": 64,
                                                   "num_key_value_heads": 3, "num_hidden_layers": 30}))
    proc = essa("train", "strategy=random_search", f"model.path={model}", "--cfg", "job", env=plugin_env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = yaml.safe_load(proc.stdout)["strategy"]
    assert (s["name"], s["population_size"], s["sigma0"], s["options"]) == ("random_search", 8, 0.05, {})
    assert s["genome"] == {"kind": "svd_lora", "alpha": 0.5, "mode": "relative", "u": 16, "tied": True}  # mode: essa's
    assert ("strategy random_search (essa_plugin_example.RandomSearch): P 8, sigma0 0.05, options {}; genome svd_lora "
            "(alpha 0.5, mode relative): D 960 = 30 layers x 4 modules x 2 factors x 4 singular values") in proc.stderr


def test_conformance_against_the_installed_module(plugin_env, tmp_path):
    test = tmp_path / "test_conformance.py"  # outside the repository: the module comes from the install
    shutil.copy(PLUGIN_SRC / "test_conformance.py", test)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env={**os.environ, **plugin_env})
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-3000:]
    probe = subprocess.run([sys.executable, "-c", "import essa_plugin_example as m; print(m.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, env={**os.environ, **plugin_env})
    assert Path(probe.stdout.strip()).parent.name == "site"  # the installed copy, not tests/plugin_example


def test_lab_compares_it_at_its_own_genome(plugin_env, tmp_path):
    out = tmp_path / "lab"
    proc = essa("lab", "compare=[{strategy:essa},{strategy:random_search}]", "n_seeds=2", "generations=2",
                "progress=false", f"hydra.run.dir={out}", env=plugin_env, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    settings = json.loads((out / "lab_summary.json").read_text())["settings"]
    assert [(s["label"], s["dim"]) for s in settings] == [("strategy=essa", 240), ("strategy=random_search", 960)]
    assert all(s["genome"]["as_run"] and s["genome"]["run_dim"] == s["dim"] for s in settings)
    assert settings[1]["vs_reference"]["score"]["n"] == 2  # paired by seed on the same problems


@pytest.mark.parametrize("override", ["strategy.name=random_search",
                                      "strategy._target_=essa_plugin_example.RandomSearch"])
def test_by_name_or_target_names_the_group_option(plugin_env, tmp_path, override):
    proc = essa("train", override, *TINY, f"hydra.run.dir={tmp_path / 'r'}", env=plugin_env, timeout=300)
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("essa: error:")]
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-2000:]
    assert "strategy=random_search" in err[0] and "diagonal" in err[0], err[0]


@pytest.mark.integration
def test_tiny_real_run_as_a_group_option(plugin_env, tmp_path):
    run = tmp_path / "run"
    proc = essa("train", "strategy=random_search", *TINY, f"hydra.run.dir={run}", env=plugin_env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    meta = json.loads((run / "run.json").read_text())
    cfg = meta["config"]["strategy"]
    assert meta["strategy"] == "random_search"
    assert cfg["sigma0"] == 0.05 and cfg["options"] == {}  # the plugin's config
    assert cfg["genome"] == {"kind": "svd_lora", "alpha": 0.5, "mode": "relative", "u": 16, "tied": True}  # essa's mode
    model_cfg = json.loads((Path(meta["model_path"]) / "config.json").read_text())
    k = math.floor(cfg["genome"]["alpha"] * meta["config"]["lora"]["rank"])
    assert meta["genome_dim"] == model_cfg["num_hidden_layers"] * 4 * 2 * k == 960  # layers x {q,k,v,o} x {A,B} x k
    started = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "strategy random_search (" in ln]
    assert len(started) == 1 and "mode relative): D 960 =" in started[0], started
    assert [m["generation"] for m in pq.read_table(run / "metrics.parquet").to_pylist()] == [0]
    assert 0.0 <= float(json.loads((run / "summary.json").read_text())["val"]["mean"]) <= 1.0
