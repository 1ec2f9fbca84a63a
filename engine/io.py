"""Atomic file output: every checkpoint, log and table is written to a temp file and renamed, so an
interrupted run never leaves a truncated file and never loses what was already written."""
from __future__ import annotations

import json
import math
import os
import pickle
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from strategies.base import PlainUnpickler


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_file(path: str | Path):
    """Yield a temp path beside ``path``; on success it replaces ``path`` (``os.replace``), on error it
    is deleted and ``path`` is left untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the mode a plain open() would
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same directory (fsync'ed) + ``os.replace``."""
    with atomic_file(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


class NoSpaceError(OSError):
    """The disk filled while a run wrote its files: a user-facing stop (one line naming the directory
    and how to resume), not a traceback."""


def write_json(path, obj: Any, strict: bool = False) -> Path:
    """Atomic JSON (indented, UTF-8). ``strict``: NaN and infinities are written as null (strict parsers
    such as jq and JavaScript reject Python's bare ``NaN``)."""
    return atomic_write_bytes(path, json.dumps(_finite_or_none(obj) if strict else obj, indent=2, default=str).encode())


def _finite_or_none(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_none(v) for v in obj]
    return obj


def write_pickle(path, obj: Any) -> Path:
    """Atomic pickle (protocol 4)."""
    return atomic_write_bytes(path, pickle.dumps(obj, protocol=4))


def read_pickle(path, classes: dict[tuple[str, str], type] | None = None) -> Any:
    """Read a pickle written by :func:`write_pickle`.

    Args:
        classes: ``{(module, name): class}`` for classes pickled under a path that has moved since
            (old checkpoints). Other than those, only plain data loads
            (:class:`strategies.base.PlainUnpickler`): a file naming any other class or function is
            unreadable, so resuming a run directory someone else wrote cannot run code.

    Raises:
        ValueError: the file is missing or unreadable (message names the file).
    """
    try:
        with open(path, "rb") as f:
            return PlainUnpickler(f, classes or {}).load()
    except FileNotFoundError:
        raise ValueError(f"resume: no checkpoint at {path}; pass resume=<run dir> of a run that finished at least one generation")
    except Exception as e:  # noqa: BLE001 - corrupt or foreign file
        raise ValueError(f"resume: checkpoint {path} is unreadable ({type(e).__name__}: {e}); "
                         f"pass another run dir or start afresh without resume") from None


def write_parquet(path, rows: dict[str, list] | list[dict]) -> Path:
    """Atomic Parquet from a column dict or a list of row dicts."""
    table = pa.Table.from_pylist(rows) if isinstance(rows, list) else pa.Table.from_pydict(rows)
    with atomic_file(path) as tmp:
        pq.write_table(table, tmp)
    return Path(path)


def read_rows(path) -> list[dict]:
    """Rows of a Parquet file; [] when it does not exist.

    Raises:
        ValueError: pyarrow cannot read the file (``"<path> is not a readable Parquet file (...)"``;
            callers append the fix).
    """
    path = Path(path)
    if not path.exists():
        return []
    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path} is not a readable Parquet file ({why})") from None


def read_json(path) -> Any:
    """A UTF-8 JSON file's value.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not UTF-8 or not valid JSON (``"<path> is not valid JSON (...)"``; callers append the fix).
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        why = f"{e.msg} at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else "not UTF-8 text"
        raise ValueError(f"{path} is not valid JSON ({why})") from None


@contextmanager
def atomic_dir(final: str | Path):
    """Build a directory atomically: yields a fresh temp sibling of ``final``
    (``.<name>.tmp-<pid>-<random>``); on success it replaces ``final`` (old content removed), on error
    it is deleted and ``final`` is left untouched. A process killed outright (SIGKILL, or SIGTERM
    outside :func:`engine.interrupts.sigterm_unwinds`) leaves the temp sibling:
    :func:`remove_stale_temp_dirs` clears those."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-{os.getpid()}-", dir=final.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
        yield tmp
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# .<name>.tmp-<pid>-<random> and .<name>.old-<pid> of atomic_dir; .<name>.tmp-<random> of older versions
_TEMP_DIR = re.compile(r"^\..+\.(?:tmp|old)-(?:(\d+)(?:-|$))?")


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _remove_dead(root: str | Path, pattern: re.Pattern) -> list[Path]:
    """Delete the directories of ``root`` whose name matches ``pattern`` (group 1: the pid of the process
    that made them, optional) and that a killed process left: last modified before the current process
    started, their process (when named) no longer running, not this process's. Returns them."""
    import psutil

    root = Path(root)
    if not root.is_dir():
        return []
    started = psutil.Process().create_time()  # seconds since the epoch
    removed = []
    for p in root.iterdir():
        m = pattern.match(p.name)
        pid = int(m.group(1)) if m and m.group(1) else None
        if m is None or pid == os.getpid():
            continue
        try:
            if not p.is_dir() or p.is_symlink() or p.stat().st_mtime >= started or (pid and _pid_running(pid)):
                continue
        except OSError:  # removed meanwhile
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def remove_stale_temp_dirs(root: str | Path) -> list[Path]:
    """Delete the temp directories :func:`atomic_dir` left in ``root`` when the process building them
    was killed: those last modified before the current process started, whose process (the pid in
    the name, when it has one) no longer runs. A live build of another process is left alone.

    Returns:
        The removed directories.
    """
    return _remove_dead(root, _TEMP_DIR)


def pid_dir_prefix(prefix: str) -> str:
    """``<prefix><this pid>-``: the name prefix of a per-process temp directory that
    :func:`remove_dead_pid_dirs` can clear after the process is killed (``tempfile.mkdtemp(prefix=...)``)."""
    return f"{prefix}{os.getpid()}-"


def remove_dead_pid_dirs(root: str | Path, prefix: str) -> list[Path]:
    """Delete the directories ``<root>/<prefix><pid>-*`` (:func:`pid_dir_prefix`) that a killed process
    left behind (SIGKILL, or an engine crash that took it down before its ``finally`` ran): those
    whose pid no longer runs and that were last modified before the current process started. A live
    process's directory, and anything not named so, is left alone.

    Args:
        root: the parent directory (e.g. /dev/shm); a missing one removes nothing.
        prefix: the name prefix before the pid, e.g. ``"essa-bench-"``.

    Returns:
        The removed directories.
    """
    return _remove_dead(root, re.compile(rf"^{re.escape(prefix)}(\d+)-"))
