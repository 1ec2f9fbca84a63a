"""Sweeps and strategy plugins for real (issue 12): the `essa` console script, real vLLM on the CPU,
the embedded model, the tiny experiment with the shared cached SFT warm start.

- the README's plugin recipe: tests/plugin_example is pip-installed as a package (into a folder on
  PYTHONPATH, so the shared venv is left alone) and trains as ``strategy=random_search``;
- an Optuna sweep (hydra-optuna-sweeper) of 4 trials over sigma0, population size and prompts per
  generation, which optimises the accuracy the task function returns;
- a Ray-launcher sweep (hydra-ray-launcher, which tools/setup_env.sh installs with --no-deps) of 2 jobs
  on a local Ray instance.
Each run is one generation, no intermediate validation and no baselines: the engine start-up dominates.
"""
from __future__ import annotations

import importlib.util
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

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
ESSA = str(Path(sys.executable).parent / "essa")
PLUGIN_SRC = REPO / "tests" / "plugin_example"
# The cheapest real run: tiny experiment (P = 4, N = 4, 32 tokens, 8 held-out problems), one generation, no
# warm start (what these tests check is the sweep and plugin machinery, not the SFT).
TINY = ["+experiment=tiny", "sft=off", "generations=1", "eval.every=0", "eval.baselines=false", "engine.kv_cache_gib=1"]


def essa(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([ESSA, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})})


def summary_accuracy(job: Path) -> float:
    return float(json.loads((job / "summary.json").read_text())["val"]["mean"])


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict:
    """``pip install`` of the example plugin package (its pyproject.toml declares the entry point), as
    a user would, into a folder put on PYTHONPATH; built from a copy so the source tree stays clean."""
    root = tmp_path_factory.mktemp("plugin")
    src = shutil.copytree(PLUGIN_SRC, root / "src", ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(src)], check=True, capture_output=True, text=True, timeout=300)
    assert (site / "essa_plugin_example.py").is_file() and list(site.glob("*.dist-info/entry_points.txt"))
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def test_installed_plugin_trains_as_a_group_option(plugin_env, tmp_path):
    run = tmp_path / "run"
    proc = essa("train", "strategy=random_search", *TINY, f"hydra.run.dir={run}", env=plugin_env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    meta = json.loads((run / "run.json").read_text())
    cfg = meta["config"]["strategy"]
    assert meta["strategy"] == "random_search"
    assert cfg["sigma0"] == 0.05 and cfg["options"] == {} and cfg["genome"]["alpha"] == 0.5  # the plugin's config
    model_cfg = json.loads((Path(meta["model_path"]) / "config.json").read_text())
    k = math.floor(cfg["genome"]["alpha"] * meta["config"]["lora"]["rank"])
    assert meta["genome_dim"] == model_cfg["num_hidden_layers"] * 4 * 2 * k  # layers x {q,k,v,o} x {A,B} x k
    assert [m["generation"] for m in pq.read_table(run / "metrics.parquet").to_pylist()] == [0]
    assert 0.0 <= summary_accuracy(run) <= 1.0


@pytest.mark.parametrize("override", ["strategy.name=random_search",
                                      "strategy._target_=essa_plugin_example.RandomSearch"])
def test_plugin_by_name_or_target_names_the_override(plugin_env, tmp_path, override):
    proc = essa("train", override, *TINY, f"hydra.run.dir={tmp_path / 'r'}", env=plugin_env, timeout=300)
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("essa: error:")]
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-2000:]
    assert "strategy=random_search" in err[0] and "diagonal" in err[0], err[0]


def test_optuna_sweep_maximises_the_returned_accuracy(tmp_path):
    sweep = tmp_path / "optuna"
    # no hydra.sweeper.direction: essa's Optuna sweeper maximises by default (issue 29)
    proc = essa("train", "-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=4",
                "hydra.sweeper.n_jobs=1", "hydra.sweeper.sampler.seed=0",
                "strategy.sigma0=tag(log,interval(0.01,0.3))", "strategy.population_size=choice(2,4)",
                "rollout.prompts_per_generation=choice(2,4)", *TINY, f"hydra.sweep.dir={sweep}", timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "Directions: ['maximize']" in proc.stdout + proc.stderr
    jobs = sorted((p for p in sweep.iterdir() if (p / ".hydra").is_dir()), key=lambda p: int(p.name))
    assert [p.name for p in jobs] == ["0", "1", "2", "3"]
    accs = [summary_accuracy(j) for j in jobs]
    sigmas = [yaml.safe_load((j / ".hydra" / "config.yaml").read_text())["strategy"]["sigma0"] for j in jobs]
    assert len(set(sigmas)) == 4 and all(0.01 <= s <= 0.3 for s in sigmas)  # Optuna sampled the space
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(max(accs))  # the task function returned each job's accuracy
    rep = essa("report", str(sweep), timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    rows = [ln for ln in rep.stdout.splitlines() if ln.startswith("| ") and "| done |" in ln]
    assert len(rows) == 4 and float(rows[0].split("|")[4].split()[0]) == pytest.approx(max(accs), abs=5e-4)
    assert (sweep / "report" / "report.md").is_file() and (sweep / "report" / "fitness.png").is_file()


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is None,
                    reason="hydra-ray-launcher not installed (tools/setup_env.sh installs it; README Sweeps)")
def test_ray_launcher_sweep_of_two_jobs(tmp_path):
    sweep = tmp_path / "ray"
    # A fresh local Ray instance (address=local); each job takes both CPUs, so the jobs run one after the other.
    # On a machine starved of CPU, Ray itself may fail to start ("The current node timed out during startup":
    # its raylet waits a fixed 15 s for its dashboard agent; README Sweeps).
    proc = essa("train", "-m", "hydra/launcher=ray", "hydra.launcher.ray.init.address=local",
                "+hydra.launcher.ray.init.num_cpus=2", "+hydra.launcher.ray.init.include_dashboard=false",
                "+hydra.launcher.ray.remote.num_cpus=2",
                "seed=0,1", *TINY, f"hydra.sweep.dir={sweep}", timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "Ray Launcher is launching 2 jobs" in proc.stdout + proc.stderr
    for job, seed in (("0", 0), ("1", 1)):
        assert f"seed={seed}" in yaml.safe_load((sweep / job / ".hydra" / "overrides.yaml").read_text())
        assert 0.0 <= summary_accuracy(sweep / job) <= 1.0
        assert [m["generation"] for m in pq.read_table(sweep / job / "metrics.parquet").to_pylist()] == [0]
