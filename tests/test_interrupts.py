"""Ctrl-C (SIGINT) of a run: engine/interrupts.py and run_train's interrupt path, without vLLM.

* SIGINT raises KeyboardInterrupt under ``interrupts.handling()`` even where the process inherited
  SIGINT ignored, which is what a job started with ``cmd &`` by a shell without job control gets
  (a CI runner's script): Python keeps an inherited SIG_IGN, and the run used to go on to exit 0;
* run_train with a fake evaluator interrupted in generation 1 leaves the checkpoint of generation 0
  as it was (no mid-generation strategy state), prints the resume hint, and raises
  KeyboardInterrupt, also when the interrupt shows up as another exception (vLLM's EngineDeadError
  when the Ctrl-C reached the engine's process too); interrupted in generation 0 it says that
  there is nothing to resume;
* a run interrupted in the validation after its checkpointed generation redoes that validation
  first when resumed.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from engine import interrupts
from engine.config import CONF_DIR
from engine.commands import register_configs

register_configs()
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _fresh():
    interrupts.reset()
    yield
    interrupts.reset()


def _deliver_sigint():
    signal.raise_signal(signal.SIGINT)
    time.sleep(0.05)  # the Python-level handler runs at the next bytecode boundary


def test_sigint_raises_and_is_recorded_even_when_inherited_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupts.handling():
                assert not interrupts.requested()
                _deliver_sigint()
        assert interrupts.requested()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # the previous disposition is back
    finally:
        signal.signal(signal.SIGINT, previous)


def test_sigterm_takes_the_interrupt_path_and_exits_143():
    """SIGTERM (timeout, docker stop, scancel) raises KeyboardInterrupt like Ctrl-C, so the run closes its
    engine and prints the resume line instead of dying with vLLM's processes orphaned; the status is 143."""
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with pytest.raises(KeyboardInterrupt):
        with interrupts.handling():
            signal.raise_signal(signal.SIGTERM)
            time.sleep(0.05)
    assert interrupts.requested() and interrupts.exit_status() == 143
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
    interrupts.reset()
    with pytest.raises(KeyboardInterrupt):
        with interrupts.handling():
            _deliver_sigint()
    assert interrupts.exit_status() == 130


CHILD = """
import signal, sys, time
from engine import interrupts
print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN, flush=True)
try:
    with interrupts.handling():
        print("ready", flush=True)
        time.sleep(60)
except KeyboardInterrupt:
    print("interrupted", interrupts.requested(), flush=True)
    sys.exit(130)
"""


def test_background_job_with_sigint_ignored_still_stops_on_sigint():
    """The CI case: a process that inherited SIGINT ignored (``cmd &`` without job control)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert proc.stdout.readline().strip() == "True"  # inherited: Python kept SIG_IGN
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and out.strip() == "interrupted True"


# ----------------------------------------------------------------------------- run_train, fake evaluator
class EngineDead(RuntimeError):
    """Stands in for vllm.v1.engine.exceptions.EngineDeadError."""


class FakeEvaluator:
    """Scores candidate k with fitness -|genome k|^2 (no engine); SIGINTs itself in ``interrupt_at``."""

    def __init__(self, run_dir: Path, interrupt_at: int, engine_dies: bool = False):
        self.run_dir, self.interrupt_at, self.engine_dies = run_dir, interrupt_at, engine_dies
        self.checkpoint_before: bytes | None = None
        self.closed = False

    def evaluate(self, genomes, problems, generation, sampling, first_candidate=0, use_tqdm=True):
        from engine.evaluation.population import EvalResult

        if generation == self.interrupt_at:
            ckpt = self.run_dir / "checkpoint.pkl"
            self.checkpoint_before = ckpt.read_bytes() if ckpt.exists() else None
            try:
                _deliver_sigint()
            except KeyboardInterrupt:
                if self.engine_dies:  # the engine process got the Ctrl-C too: the driver sees it dead
                    raise EngineDead("EngineCore encountered an issue") from None
                raise
            raise AssertionError("SIGINT did not interrupt the run")
        P, N = len(genomes), len(problems)
        fitness = -np.sum(np.asarray(genomes) ** 2, axis=1)
        rewards = np.repeat(fitness[:, None, None], N, axis=1)
        rows = {k: [] for k in ("generation", "candidate", "prompt_id", "sample", "completion", "extracted_answer",
                                "reward", "status", "n_tokens")}
        for p in range(P):
            for n in range(N):
                for k, v in zip(rows, (generation, first_candidate + p, problems[n].id, 0, "x", None,
                                       float(fitness[p]), "ok", 1)):
                    rows[k].append(v)
        return EvalResult(fitness, rewards, rows, {"generate": 0.01}, P * N)

    def score(self, adapters, problems, sampling, timings=None, use_tqdm=True):
        A, N = len(adapters), len(problems)
        return np.zeros((A, N, 1)), [[[]] * N] * A, [None] * (A * N), ["ok"] * (A * N)

    def write_candidates(self, genomes, generation, first_candidate=0, timings=None):
        from engine.backends import AdapterRef
        return [AdapterRef(f"g{generation}c{first_candidate + k}", 1 + k, "/nonexistent") for k in range(len(genomes))]

    def release(self, generation):
        pass

    def close(self):
        self.closed = True


@pytest.fixture
def fake_run(monkeypatch, tmp_path):
    """run_train with everything heavy replaced: no model, no SFT, no tokenizer, a fake evaluator."""
    import transformers

    from engine.lora.files import write_adapter
    from strategies.genomes import random_lora

    sft = write_adapter(tmp_path / "sft", random_lora(num_layers=2, rank=8, hidden=32, kv_dim=16), 8, 16.0, "fake")
    monkeypatch.setattr("engine.model.resolve_model_path", lambda path, *a: "fake-model")
    monkeypatch.setattr("engine.lora.sft.warm_start", lambda *a, **k: sft)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", staticmethod(lambda *a, **k: None))
    made = {}

    def build(interrupt_at: int, engine_dies: bool = False):
        def build_evaluator(*args, **kwargs):
            made["evaluator"] = FakeEvaluator(tmp_path / "run", interrupt_at, engine_dies)
            return made["evaluator"]
        monkeypatch.setattr("engine.evaluation.build.build_evaluator", build_evaluator)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="train", overrides=["+experiment=tiny", "generations=3", "eval.baselines=false",
                                                          "task.train_size=16", "task.val_size=2"])
        return cfg, made

    return build, tmp_path / "run"


@pytest.mark.parametrize("engine_dies", [False, True], ids=["keyboard-interrupt", "engine-dead-after-sigint"])
def test_interrupt_keeps_the_last_generations_checkpoint(fake_run, engine_dies, capsys):
    from engine import io
    from engine.commands.train import run_train

    build, run_dir = fake_run
    cfg, made = build(interrupt_at=1, engine_dies=engine_dies)
    with interrupts.handling():
        with pytest.raises(KeyboardInterrupt):
            run_train(cfg, run_dir)
    ev = made["evaluator"]
    assert ev.checkpoint_before is not None, "generation 0 left no checkpoint"
    # generation 1's ask() had already moved the strategy on: the checkpoint must not take that state
    assert (run_dir / "checkpoint.pkl").read_bytes() == ev.checkpoint_before
    assert io.read_pickle(run_dir / "checkpoint.pkl")["run_state"]["generation"] == 0
    err = capsys.readouterr().err
    assert f"checkpoint of generation 0 in {run_dir / 'checkpoint.pkl'}" in err and f"resume={run_dir}" in err
    assert ("EngineDead after Ctrl-C" in err) == engine_dies
    assert ev.closed


@pytest.mark.parametrize("ending", ["finished", "failed", "ctrl-c"])
def test_mlflow_shows_how_essa_train_ended(fake_run, monkeypatch, ending):
    """A run that raises after the tracker started is FAILED in MLflow, one stopped by Ctrl-C KILLED (real
    MLflow client, file store in the run directory)."""
    import mlflow
    from omegaconf import OmegaConf

    from engine.commands.train import run_train

    build, run_dir = fake_run
    cfg, made = build(interrupt_at=1 if ending == "ctrl-c" else -1)
    cfg = OmegaConf.merge(cfg, {"logger": {"name": "mlflow"}, "report": False})
    if ending == "failed":
        monkeypatch.setattr(FakeEvaluator, "score", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("scoring broke")))
    with interrupts.handling():
        if ending == "finished":
            run_train(cfg, run_dir)
        else:
            with pytest.raises(KeyboardInterrupt if ending == "ctrl-c" else RuntimeError):
                run_train(cfg, run_dir)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{run_dir / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    runs = mlflow.search_runs(experiment_names=["essa"], output_format="list")
    assert [r.info.status for r in runs] == [{"finished": "FINISHED", "failed": "FAILED", "ctrl-c": "KILLED"}[ending]]


def test_interrupt_before_the_first_generation_finished_has_nothing_to_resume(fake_run, capsys):
    from engine.commands.train import run_train

    build, run_dir = fake_run
    cfg, made = build(interrupt_at=0)
    with interrupts.handling():
        with pytest.raises(KeyboardInterrupt):
            run_train(cfg, run_dir)
    assert not (run_dir / "checkpoint.pkl").exists()
    err = capsys.readouterr().err
    assert "nothing to resume" in err and "resume=" not in err
    assert made["evaluator"].closed


def test_an_error_without_an_interrupt_is_not_an_interrupt(fake_run, capsys, monkeypatch):
    from engine.commands.train import run_train

    build, run_dir = fake_run
    cfg, made = build(interrupt_at=-1)

    def broken(*a, **k):
        raise EngineDead("a real engine failure")

    monkeypatch.setattr(FakeEvaluator, "evaluate", broken)
    with pytest.raises(EngineDead):
        run_train(cfg, run_dir)
    assert "interrupted" not in capsys.readouterr().err


def test_resume_redoes_the_validation_the_interrupt_cut_short(fake_run, monkeypatch):
    """Ctrl-C in the validation after generation 0 (checkpoint of generation 0 already written):
    the resumed run validates step 1 before generation 1, so validation.parquet has every step."""
    from engine import io
    from engine.commands.train import run_train

    build, run_dir = fake_run
    cfg, made = build(interrupt_at=-1)  # eval.every = 1 (tiny): a validation after every generation
    score = FakeEvaluator.score
    calls = []

    def interrupted_once(self, adapters, problems, sampling, timings=None, use_tqdm=True):
        calls.append([a.name for a in adapters])
        if len(calls) == 1:  # the validation of step 1
            _deliver_sigint()
        return score(self, adapters, problems, sampling, timings, use_tqdm)

    monkeypatch.setattr(FakeEvaluator, "score", interrupted_once)
    with interrupts.handling():
        with pytest.raises(KeyboardInterrupt):
            run_train(cfg, run_dir)
    assert io.read_pickle(run_dir / "checkpoint.pkl")["run_state"]["generation"] == 0
    assert not (run_dir / "validation.parquet").exists()

    interrupts.reset()
    cfg.resume = str(run_dir)
    run_train(cfg, run_dir)
    steps = sorted({(r["step"], r["condition"]) for r in io.read_rows(run_dir / "validation.parquet")})
    assert steps == [(1, "mean"), (2, "mean"), (3, "best"), (3, "mean")]
    assert calls[1] == ["g0c5"]  # redone first, on the mean genome checkpointed after generation 0 (P = 4)


@pytest.fixture(params=["as written", "strategies.cma_es moved"])
def cma_es_moved(request, monkeypatch):
    """With "strategies.cma_es moved", the path ``strategies.cma_es`` holds none of its classes (as after a
    move or rename of the module): a checkpoint resolves them only through explicit maps of old paths."""
    if request.param != "as written":
        import sys
        import types

        monkeypatch.setitem(sys.modules, "strategies.cma_es", types.ModuleType("strategies.cma_es"))
    return request.param


def test_a_version_1_checkpoint_resumes_exactly(fake_run, cma_es_moved):
    """A run checkpointed by the code before the restructuring (tests/fixtures/checkpoint_v1: version 1,
    ``RunState`` pickled under its old class path ``engine.loop.RunState``, 1 generation) resumes on
    today's code, which continues from generation 1 and reproduces the uninterrupted old run (3
    generations) exactly: the same candidates, so the same fitness, and the same sigma."""
    import json
    import shutil

    from engine import io
    from engine.commands.train import run_train
    from engine.commands.train_checkpoint import CHECKPOINT_VERSION

    fixture = Path(__file__).parent / "fixtures" / "checkpoint_v1"
    build, run_dir = fake_run
    shutil.copytree(fixture, run_dir)
    import types
    assert io.read_pickle(run_dir / "checkpoint.pkl", classes={("engine.loop", "RunState"): types.SimpleNamespace})["version"] == 1
    cfg, made = build(interrupt_at=-1)
    cfg.resume, cfg.report = str(run_dir), False
    run_train(cfg, run_dir)
    got = io.read_rows(run_dir / "metrics.parquet")
    want = json.loads((fixture / "expected.json").read_text())["uninterrupted"]
    assert [r["generation"] for r in got] == [0, 1, 2]
    for g, w in zip(got, want):
        for key in ("fitness_mean", "fitness_max", "fitness_min", "fitness_center", "sigma"):
            assert g[key] == pytest.approx(w[key], rel=1e-12, abs=1e-12), (g["generation"], key)
    ckpt = io.read_pickle(run_dir / "checkpoint.pkl")
    assert ckpt["version"] == CHECKPOINT_VERSION == 2 and ckpt["run_state"]["generation"] == 2
    assert isinstance(ckpt["run_state"], dict)  # plain data now: no class path to move
    from strategies.testing import pickled_classes
    names = pickled_classes((run_dir / "checkpoint.pkl").read_bytes())  # pycma's nested pickle included
    assert "cma.evolution_strategy.CMAEvolutionStrategy" in names
    assert not [n for n in names if n.split(".")[0] in ("strategies", "engine", "rewards")], names


def test_an_unknown_checkpoint_version_lists_the_versions_this_build_reads(tmp_path):
    from engine import io
    from engine.commands.train_checkpoint import read_checkpoint

    io.write_pickle(tmp_path / "checkpoint.pkl", {"version": 3})
    with pytest.raises(ValueError) as e:
        read_checkpoint(tmp_path)
    assert str(e.value) == (f"resume: {tmp_path / 'checkpoint.pkl'} has checkpoint version 3, this essa reads "
                            "versions 1, 2; resume it with the essa that wrote it, or start afresh without resume")


def test_metrics_count_the_answer_checks_that_timed_out(fake_run, monkeypatch):
    """Issue 40: how many verdicts of a generation were timeouts (reward.timeout_s) is a metrics column."""
    from engine import io
    from engine.commands.train import run_train

    real = FakeEvaluator.evaluate

    def some_timeouts(self, genomes, problems, generation, *args, **kwargs):
        result = real(self, genomes, problems, generation, *args, **kwargs)
        result.rollouts["status"][:generation] = ["timeout"] * generation  # generation g: g timeouts
        return result

    monkeypatch.setattr(FakeEvaluator, "evaluate", some_timeouts)
    build, run_dir = fake_run
    cfg, _ = build(interrupt_at=-1)
    cfg.report = False
    run_train(cfg, run_dir)
    assert [r["n_timeouts"] for r in io.read_rows(run_dir / "metrics.parquet")] == [0, 1, 2]


def test_tied_generations_leave_the_mean_where_it_is(fake_run, monkeypatch):
    """Fitness 0 for every candidate in every generation (issue 40: the lra_cma mean reached norm 3.78 in three
    such generations): the mean stays at genome zero, strategy.mean_decay does not move it either, and the
    metrics say all_tied."""
    from omegaconf import OmegaConf

    from engine import io
    from engine.commands.train import run_train

    real = FakeEvaluator.evaluate

    def all_zero(self, genomes, *args, **kwargs):
        result = real(self, genomes, *args, **kwargs)
        result.fitness[:] = 0.0
        return result

    monkeypatch.setattr(FakeEvaluator, "evaluate", all_zero)
    build, run_dir = fake_run
    cfg, _ = build(interrupt_at=-1)
    cfg = OmegaConf.merge(cfg, {"strategy": {"name": "lra_cma", "mean_decay": 0.3}, "report": False})
    cfg.strategy.options = {}  # a merge keeps cma_es's options
    run_train(cfg, run_dir)
    rows = io.read_rows(run_dir / "metrics.parquet")
    assert [(r["all_tied"], r["mean_norm"]) for r in rows] == [(True, 0.0)] * 3
    assert len({r["sigma"] for r in rows}) == 1


def test_mean_decay_and_adaptive_prompts_resume_exactly(fake_run, monkeypatch, tmp_path):
    """strategy.mean_decay and rollout.adaptive_prompts: a run interrupted after generation 0 and resumed
    logs the same generations as an uninterrupted one (N per generation, the decayed mean's norm, fitness)."""
    from engine import io
    from engine.commands.train import run_train

    monkeypatch.setattr("engine.results.stats.split_half_rank_correlation", lambda rewards: 0.0)  # always noise
    build, run_dir = fake_run
    levers = {"strategy": {"mean_decay": 0.3}, "rollout": {"adaptive_prompts": True, "max_prompts_per_generation": 12}}

    def cfg_for(interrupt_at):
        from omegaconf import OmegaConf
        cfg, made = build(interrupt_at=interrupt_at)
        return OmegaConf.merge(cfg, levers, {"report": False}), made

    cfg, _ = cfg_for(-1)
    run_train(cfg, tmp_path / "straight")
    want = io.read_rows(tmp_path / "straight" / "metrics.parquet")
    cfg, _ = cfg_for(1)
    with interrupts.handling():
        with pytest.raises(KeyboardInterrupt):
            run_train(cfg, run_dir)
    interrupts.reset()
    cfg, _ = cfg_for(-1)
    cfg.resume = str(run_dir)
    run_train(cfg, run_dir)
    got = io.read_rows(run_dir / "metrics.parquet")
    assert [r["prompts"] for r in got] == [r["prompts"] for r in want] == [4, 8, 12]  # doubled, then capped
    for g, w in zip(got, want):
        for key in ("mean_norm", "fitness_mean", "fitness_max", "sigma"):
            assert g[key] == pytest.approx(w[key], rel=1e-12), (g["generation"], key)


@pytest.mark.parametrize("strategy", ["lra_cma", "openai_es"])
def test_new_strategies_resume_exactly_through_run_train(fake_run, tmp_path, strategy):
    """LRA-CMA-ES and OpenAI-ES through essa train's loop: interrupted after generation 0 and resumed,
    they log what an uninterrupted run logs (their state, RNG included, rides in the checkpoint)."""
    from omegaconf import OmegaConf

    from engine import io
    from engine.commands.train import run_train

    build, run_dir = fake_run

    def cfg_for(interrupt_at):
        cfg, _ = build(interrupt_at=interrupt_at)
        cfg.strategy.options = {}  # strategy=essa's options (diagonal) are CMA-ES's own
        return OmegaConf.merge(cfg, {"strategy": {"name": strategy}, "report": False})

    run_train(cfg_for(-1), tmp_path / "straight")
    want = io.read_rows(tmp_path / "straight" / "metrics.parquet")
    with interrupts.handling():
        with pytest.raises(KeyboardInterrupt):
            run_train(cfg_for(1), run_dir)
    interrupts.reset()
    cfg = cfg_for(-1)
    cfg.resume = str(run_dir)
    run_train(cfg, run_dir)
    got = io.read_rows(run_dir / "metrics.parquet")
    assert [r["generation"] for r in got] == [0, 1, 2]
    for g, w in zip(got, want):
        for key in ("fitness_mean", "fitness_max", "fitness_center", "sigma", "mean_norm"):
            assert g[key] == pytest.approx(w[key], rel=1e-12), (strategy, g["generation"], key)


def test_a_full_disk_is_one_line_with_the_resume_command(tmp_path, monkeypatch):
    """The disk fills while the run writes (safetensors raises its own error, not an OSError): the run
    stops with io.NoSpaceError (a one-line user error) naming the run directory and the resume= command."""
    from engine import io
    from engine.commands import train

    class SafetensorError(Exception):
        pass

    def full(cfg, run_dir, progress):
        progress.run_dir, progress.checkpoint_generation = tmp_path, 3
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              "\"No space left on device\" })")

    monkeypatch.setattr(train, "_run_train", full)
    with pytest.raises(io.NoSpaceError, match=f"resume={tmp_path} .*generation 3 is kept"):
        train.run_train(None, tmp_path)
    from engine.cli.hydra_app import USER_ERRORS
    assert issubclass(io.NoSpaceError, USER_ERRORS)


def test_an_interrupt_swallowed_inside_redelivered_comes_again():
    """vLLM's start-up handshake catches KeyboardInterrupt and goes on waiting for its dead engine: within
    interrupts.redelivered() the recorded Ctrl-C is sent again until it gets through."""
    swallowed = 0
    with pytest.raises(KeyboardInterrupt):
        with interrupts.handling(), interrupts.redelivered(period_s=0.1):
            try:
                _deliver_sigint()
            except KeyboardInterrupt:  # what vllm.utils.network_utils.zmq_socket_ctx does
                swallowed += 1
            deadline = time.time() + 5
            while time.time() < deadline:  # the engine's poll, waiting for a process that died
                time.sleep(0.01)
    assert swallowed == 1 and interrupts.requested()


def test_a_resumed_runs_log_continues_in_its_own_directory(tmp_path):
    """essa train resume=<dir>: Hydra logs this invocation to a new directory; the run's own log file in
    <dir> gets the resumed part too (appended), so one run keeps one log."""
    import logging

    from engine.commands.train import continue_log_in

    (tmp_path / "new").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "hydra_app.log").write_text("generation 0 line\n")
    hydra_handler = logging.FileHandler(tmp_path / "new" / "hydra_app.log")
    hydra_handler.set_name("file")            # as Hydra's job_logging config names it
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    root.addHandler(hydra_handler)
    root.setLevel(logging.INFO)
    try:
        continue_log_in(tmp_path / "new")      # resumed into Hydra's own directory: nothing added
        assert len(root.handlers) == len(before) + 1
        continue_log_in(tmp_path / "run")
        continue_log_in(tmp_path / "run")      # a second call adds nothing (every line would be written twice)
        assert len(root.handlers) == len(before) + 2
        logging.getLogger("essa").warning("gen 1 line")
    finally:
        for h in root.handlers[:]:
            if h not in before:
                root.removeHandler(h)
                h.close()
        root.setLevel(level)
    kept = (tmp_path / "run" / "hydra_app.log").read_text()
    assert kept.startswith("generation 0 line\n") and "gen 1 line" in kept and "resume: logging to" in kept
    assert "gen 1 line" in (tmp_path / "new" / "hydra_app.log").read_text() and kept.count("gen 1 line") == 1
