"""Sweeps and strategy plugins for real (issue 12): the `essa` console script, real vLLM on the CPU,
the embedded model, the tiny experiment with the shared cached SFT warm start.

- an Optuna sweep (hydra-optuna-sweeper) of 4 trials over sigma0, population size and prompts per
  generation, which optimises the accuracy the task function returns;
- a Ray-launcher sweep (hydra-ray-launcher, which tools/setup_env.sh installs with --no-deps) of 2 jobs
  on a local Ray instance.
Each run is one generation, no intermediate validation and no baselines: the engine start-up dominates.
The README's plugin recipe as an installed package: tests/test_plugin_package.py.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
ESSA = str(Path(sys.executable).parent / "essa")
# The cheapest real run: tiny experiment (P = 4, N = 4, 32 tokens, 8 held-out problems), one generation, no
# warm start (what these tests check is the sweep machinery, not the SFT).
TINY = ["+experiment=tiny", "sft=off", "generations=1", "eval.every=0", "eval.baselines=false", "engine.kv_cache_gib=1"]


def essa(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([ESSA, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})})


def summary_accuracy(job: Path) -> float:
    return float(json.loads((job / "summary.json").read_text())["val"]["mean"])


@pytest.mark.slow  # four tiny runs; the sweeper contract is unit-tested (tests/test_sweeps.py); make test-all
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
                    reason="hydra-ray-launcher not installed (tools/setup_env.sh installs it; docs/guide/sweeps.md)")
def test_ray_launcher_sweep_of_two_jobs(tmp_path):
    sweep = tmp_path / "ray"
    # A fresh local Ray instance (address=local); each job takes both CPUs, so the jobs run one after the other.
    # On a machine starved of CPU, Ray itself may fail to start ("The current node timed out during startup":
    # its raylet waits a fixed 15 s for its dashboard agent; docs/guide/sweeps.md).
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
