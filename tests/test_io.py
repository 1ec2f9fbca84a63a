"""Atomic outputs: a write that fails half-way leaves what was already there, and no temp files."""
from __future__ import annotations

import pytest

from engine import io


def _siblings(path):
    return sorted(p.name for p in path.parent.iterdir())


def test_write_json_and_parquet_round_trip(tmp_path):
    io.write_json(tmp_path / "a.json", {"x": 1})
    assert (tmp_path / "a.json").read_text().strip().startswith("{")
    io.write_parquet(tmp_path / "m.parquet", [{"generation": 0, "wall_s": 1.5}, {"generation": 1, "wall_s": 3.0}])
    assert io.read_rows(tmp_path / "m.parquet") == [{"generation": 0, "wall_s": 1.5}, {"generation": 1, "wall_s": 3.0}]
    assert io.read_rows(tmp_path / "missing.parquet") == []
    assert _siblings(tmp_path / "a.json") == ["a.json", "m.parquet"]


def test_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "metrics.parquet"
    io.write_parquet(target, [{"generation": 0}])
    with pytest.raises(Exception):
        io.write_parquet(target, [{"generation": object()}])  # pyarrow cannot convert it
    assert io.read_rows(target) == [{"generation": 0}]
    assert _siblings(target) == ["metrics.parquet"]  # the temp file is gone


def test_failed_directory_build_keeps_the_old_directory(tmp_path):
    final = tmp_path / "adapter"
    with io.atomic_dir(final) as tmp:
        (tmp / "weights").write_text("v1")
    with pytest.raises(RuntimeError):
        with io.atomic_dir(final) as tmp:
            (tmp / "weights").write_text("half")
            raise RuntimeError("killed mid-write")
    assert (final / "weights").read_text() == "v1"
    assert _siblings(final) == ["adapter"]


def test_checkpoint_errors_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="resume=<run dir>"):
        io.read_pickle(tmp_path / "checkpoint.pkl")
    (tmp_path / "bad.pkl").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="unreadable"):
        io.read_pickle(tmp_path / "bad.pkl")


def test_outputs_get_the_usual_permissions(tmp_path):
    import os
    import stat

    mask = os.umask(0o022)
    try:
        io.write_json(tmp_path / "a.json", {})
        with io.atomic_dir(tmp_path / "d") as d:
            (d / "x").write_text("1")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755


def test_stale_temp_dirs_are_removed_and_live_ones_kept(tmp_path):
    """A temp dir of a killed build (older than this process, its pid gone) goes; a live build stays."""
    import os
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # a pid that no longer runs
    stale = [tmp_path / f".abc.tmp-{dead_pid}-x1y2", tmp_path / ".abc.tmp-q7_zk3pa", tmp_path / f".abc.old-{dead_pid}"]
    live = tmp_path / f".def.tmp-{os.getpid()}-x1y2"  # this process: still building
    fresh = tmp_path / f".ghi.tmp-{dead_pid}-x1y2"  # made after this process started
    keep = [tmp_path / "abc", tmp_path / ".hidden"]  # a finished entry, an unrelated dot dir
    for d in stale + [live, fresh] + keep:
        d.mkdir()
        (d / "weights").write_text("half")
    for d in stale + [live] + keep:
        os.utime(d, (0, 0))  # 1970: before this process started
    assert sorted(io.remove_stale_temp_dirs(tmp_path)) == sorted(stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in [live, fresh] + keep)
    assert io.remove_stale_temp_dirs(tmp_path / "missing") == []


class _RunsCode:
    def __reduce__(self):
        import os
        return (os.system, ("touch ran_code",))


def test_a_checkpoint_that_names_code_is_unreadable_and_runs_nothing(tmp_path, monkeypatch):
    """resume= of a directory someone else wrote: pickle would call whatever a file names; read_pickle
    accepts plain data only and says the file is unreadable."""
    import pickle

    import numpy as np

    from engine.io import read_pickle, write_pickle

    monkeypatch.chdir(tmp_path)
    (tmp_path / "evil.pkl").write_bytes(pickle.dumps({"version": 2, "x": _RunsCode()}))
    with pytest.raises(ValueError, match="unreadable .*os.system is not plain data|unreadable .*posix.system is not plain data"):
        read_pickle(tmp_path / "evil.pkl")
    assert not (tmp_path / "ran_code").exists()
    data = {"a": np.arange(3.0), "rng": np.random.default_rng(0).bit_generator.state, "b": b"x", "s": {1, 2}}
    back = read_pickle(write_pickle(tmp_path / "ok.pkl", data))
    assert back["rng"] == data["rng"] and back["s"] == {1, 2} and np.array_equal(back["a"], data["a"])


def test_model_path_that_is_not_a_model_is_one_line(tmp_path, monkeypatch):
    """A directory without config.json, or a HF id neither cached nor confirmed by the hub (offline here),
    stops with FileNotFoundError naming model.path before anything loads (it was a transformers traceback)."""
    from engine.model import resolve_model_path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"model.path=.* is a directory without config.json"):
        resolve_model_path(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"model.path='nobody/not-a-model-xyz': not a local model directory"):
        resolve_model_path("nobody/not-a-model-xyz")
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)
