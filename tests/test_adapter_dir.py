"""Where candidate adapters and bench files live in RAM, and what a full or stale /dev/shm does (issue 29).

- ``engine.adapter_dir`` (default /dev/shm, 64 MB in Docker) too small for the population's P + 2
  adapters: the evaluator falls back to the temp dir on disk with one warning, or stops with one line
  naming ``engine.adapter_dir``; a device that fills up later stops with that line, not safetensors'
  traceback (the run for real, on a 16 MB tmpfs: see the issue 29 report);
- directories of killed processes (``essa-adapters-<pid>-*``, ``essa-bench-<pid>-*``) are removed at the
  next start, live ones kept; a SIGTERM of ``essa bench`` removes its own.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

from engine.lora.files import AdapterMeta, adapter_bytes, adapter_root_with_space, is_no_space

REPO = Path(__file__).resolve().parent.parent
Usage = namedtuple("Usage", "total used free")
MB = 1_000_000


class Codec:
    """A genome codec of a 2-layer q/k/v/o LoRA (r 8, width 576: 0.25 MB an adapter)."""

    def __init__(self):
        from strategies.genomes import random_lora

        self.lora = random_lora(num_layers=2)

    def x0(self):
        return np.zeros(1)

    def decode(self, genome):
        return self.lora

    def decode_batch(self, genomes):
        return [self.lora for _ in genomes]


def fake_free(monkeypatch, free_by_root: dict[Path, int]):
    """shutil.disk_usage with ``free`` bytes per directory (others: plenty)."""
    real = shutil.disk_usage

    def usage(path):
        for root, free in free_by_root.items():
            if Path(path) == root:
                return Usage(10 * free + 1, 0, free)
        return real(path)

    monkeypatch.setattr(shutil, "disk_usage", usage)


def evaluator(adapter_dir, n_adapters):
    from engine.evaluation.population import PopulationEvaluator

    meta = AdapterMeta(8, 16.0, ("q_proj", "k_proj", "v_proj", "o_proj"), "base")
    return PopulationEvaluator(None, Codec(), None, meta, None, "", adapter_dir, n_adapters=n_adapters)


def test_adapter_bytes_of_the_default_model():
    """SmolLM2-135M, r 8, q/k/v/o, float32: 30 layers x (4 A (8 x 576) + B 576, 192, 192, 576 x 8) x 4 B."""
    from strategies.genomes import random_lora

    assert adapter_bytes(random_lora()) == 30 * (4 * 8 * 576 + 8 * (576 + 192 + 192 + 576)) * 4 + 64 * 1024


def test_small_adapter_dir_falls_back_to_disk_with_one_warning(tmp_path, monkeypatch, caplog):
    """The repro: 8 + 2 adapters of ~3.8 MB in a 16 MB tmpfs (here a directory reporting 16 MB free)."""
    small, disk = tmp_path / "shm", tmp_path / "disk"
    monkeypatch.setattr("tempfile.tempdir", str(disk))
    fake_free(monkeypatch, {small: 16 * MB, disk: 10_000 * MB})
    from strategies.genomes import random_lora

    need = 10 * adapter_bytes(random_lora())  # 38 MB
    with caplog.at_level(logging.INFO, logger="essa"):
        root = adapter_root_with_space(str(small), need, 10)
    assert root == disk
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    msg = warnings[0].getMessage()
    assert msg.startswith("engine.adapter_dir: ") and str(small) in msg and str(disk) in msg and "10 candidate" in msg
    caplog.clear()
    assert adapter_root_with_space(str(small), 15 * MB, 10) == small and not caplog.records  # fits: no warning


def test_no_space_anywhere_is_one_line_naming_the_field(tmp_path, monkeypatch):
    small, disk = tmp_path / "shm", tmp_path / "disk"
    monkeypatch.setattr("tempfile.tempdir", str(disk))
    fake_free(monkeypatch, {small: 16 * MB, disk: 20 * MB})
    with pytest.raises(ValueError) as e:
        adapter_root_with_space(str(small), 38 * MB, 10)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"engine.adapter_dir={small}: ")
    assert "need 38 MB" in msg and "16 MB free in" in msg and "20 MB free in" in msg and "set engine.adapter_dir=" in msg


def test_evaluator_checks_the_space_of_its_population(tmp_path, monkeypatch):
    """PopulationEvaluator(n_adapters=P + 2) puts its directory where that many adapters fit."""
    small, disk = tmp_path / "shm", tmp_path / "disk"
    monkeypatch.setattr("tempfile.tempdir", str(disk))
    per = adapter_bytes(Codec().lora)
    fake_free(monkeypatch, {small: 5 * per, disk: 100 * per})
    ev = evaluator(small, n_adapters=4)   # fits
    assert ev.root.parent == small and ev.root.name.startswith(f"essa-adapters-{os.getpid()}-")
    ev.close()
    ev = evaluator(small, n_adapters=10)  # does not: the temp dir
    assert ev.root.parent == disk
    ev.close()
    fake_free(monkeypatch, {small: 5 * per, disk: 5 * per})
    with pytest.raises(ValueError, match=r"^engine\.adapter_dir="):
        evaluator(small, n_adapters=10)


def test_full_device_while_writing_is_the_same_one_line(tmp_path, monkeypatch):
    """A device that fills up after the start (another process took the space): safetensors' own error
    type becomes the one line naming engine.adapter_dir, and the half-written generation is removed."""
    from safetensors import SafetensorError

    import engine.evaluation.population as population

    ev = evaluator(tmp_path, n_adapters=None)
    calls = []

    def full(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        Path(path).mkdir(parents=True)
        return Path(path)

    monkeypatch.setattr(population, "write_adapter", full)
    with pytest.raises(ValueError) as e:
        ev.write_candidates(np.zeros((3, 1)), generation=0)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"engine.adapter_dir={tmp_path}: ") and "3 candidate adapters" in msg
    assert e.value.__cause__ is None and not (ev.root / "gen_000000").exists()
    monkeypatch.setattr(population, "write_adapter", lambda *a, **k: (_ for _ in ()).throw(OSError(13, "denied")))
    with pytest.raises(OSError):  # any other error is not a full device
        ev.write_candidates(np.zeros((1, 1)), generation=1)
    ev.close()


def test_is_no_space():
    from safetensors import SafetensorError

    assert is_no_space(OSError(28, "No space left on device"))
    assert is_no_space(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"))
    assert not is_no_space(OSError(13, "Permission denied")) and not is_no_space(RuntimeError("oops"))


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


@pytest.mark.parametrize("prefix", ["essa-adapters-", "essa-bench-"])
def test_directories_of_killed_processes_are_removed(tmp_path, prefix):
    from engine import io

    dead = _dead_pid()
    stale = tmp_path / f"{prefix}{dead}-ab12"
    live = tmp_path / f"{prefix}1-ab12"                        # pid 1 always runs
    fresh = tmp_path / f"{prefix}{dead}-cd34"                  # made after this process started
    other = [tmp_path / f"{prefix}abcd1234", tmp_path / f"other-{dead}-x"]  # not <prefix><pid>-
    for d in [stale, live, fresh, *other]:
        d.mkdir()
        (d / "adapter_model.safetensors").write_text("x")
    for d in [stale, live, *other]:
        os.utime(d, (0, 0))
    assert io.remove_dead_pid_dirs(tmp_path, prefix) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in [live, fresh, *other])
    assert io.remove_dead_pid_dirs(tmp_path / "missing", prefix) == []


def test_evaluator_and_bench_clear_what_killed_runs_left(tmp_path):
    from engine.commands.bench import bench_root

    dead = _dead_pid()
    for name in (f"essa-adapters-{dead}-ab12", f"essa-bench-{dead}-ab12"):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (0, 0))
    ev = evaluator(tmp_path, n_adapters=None)
    assert not (tmp_path / f"essa-adapters-{dead}-ab12").exists() and ev.root.exists()
    root = bench_root(tmp_path)
    assert not (tmp_path / f"essa-bench-{dead}-ab12").exists()
    assert root.parent == tmp_path and root.name.startswith(f"essa-bench-{os.getpid()}-")
    ev.close()


BENCH_CHILD = r"""
import sys, time
from pathlib import Path
import engine.commands.bench as bench

parent = Path(sys.argv[1])

def prepare(cfg):
    b = bench.Bench(cfg, [2], 1, 1, 2)
    b.root = bench.bench_root(parent)
    return b

def hang(b):
    (b.root / "cand_0").mkdir()
    print("ready", flush=True)
    time.sleep(60)

bench.prepare, bench.base_without_lora = prepare, hang
bench.main(None)
print("returned", flush=True)
"""


def test_sigterm_of_bench_removes_its_directory(tmp_path):
    """Issue 29f: ``kill <essa bench>`` left /dev/shm/essa-bench-*; now the finally runs before SIGTERM ends it."""
    proc = subprocess.Popen([sys.executable, "-c", BENCH_CHILD, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert [p.name.startswith(f"essa-bench-{proc.pid}-") for p in tmp_path.iterdir()] == [True]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM and out.strip() == ""
    assert list(tmp_path.iterdir()) == []
