"""A small process pool with a hard time limit per item, for math-verify checks.

Why not `concurrent.futures.ProcessPoolExecutor` or `multiprocessing`:

- an executor cannot stop one running task, so one hung sympy call (``5^{5^{5^5}}``) blocks
  a worker for ever, and the only way out is to tear the whole executor down;
- ``spawn``/``forkserver`` children re-import the caller's ``__main__`` (re-running an
  unguarded training script in every worker), ``fork`` copies CUDA contexts and threads,
  and a daemonic process (a `multiprocessing.Pool` worker) may not start children at all.

So each worker is a plain ``python -m rewards._worker`` started with `subprocess.Popen`,
talking over two private pipes with `multiprocessing.connection` framing, with at most one
item in flight. An item's limit is CPU time, counted by the worker (`rewards._worker.check_within`:
a profiling timer, and the kernel's ``RLIMIT_CPU`` for a check stuck in C code), so a verdict does
not depend on the machine's load: under load 5-8 on 2 cores a wall-clock limit of 5 s judged a
legitimate one-second symbolic check a timeout. The parent waits on all pipes with
`multiprocessing.connection.wait` and a wall-clock backstop (:func:`wall_backstop_s`, 10 x the
limit) for a check that hangs without using CPU; a worker past it is SIGKILLed and replaced. No
signals are used in the parent, so this works from any thread and inside any process.

Workers start lazily, on the first item that needs them; importing `rewards` starts
nothing. Start-up (the sympy import, about a second) is never charged to an item. Each worker caps its
address space (``RLIMIT_AS``), dies with its parent (``PR_SET_PDEATHSIG``, so workers are
started from one long-lived thread), and is recycled after `max_tasks`
items to bound sympy's caches. POSIX only (``pass_fds``).

Two kinds of checker run in such workers (``kind``, one pool per kind): ``math`` (math-verify,
`rewards._verify_impl.verify_pair`, items ``(pred, ref)``) and ``gym`` (a reasoning-gym dataset's own
``score_answer``, `rewards._gym_impl.score`, items ``(answer, dataset, ref)``). A worker imports
and warms up its checker before it reports ready.

Results returned per item: the checker's (``math``: a status string; ``gym``: a float score or
``"ref_error"``) or ``"timeout"`` (over the limit, or the worker died while checking this item) or
``"error"`` (no worker could be started).
"""

from __future__ import annotations

import atexit
import os
import queue
import subprocess
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import Connection, wait

STARTUP_TIMEOUT_S = 120.0  # seconds a batch waits for a worker before giving up
WALL_BACKSTOP_FACTOR = 10.0
"""An item's wall-clock backstop is this many times its CPU-time limit (a worker that gets a quarter of
a core under load 8 on 2 cores still reaches its CPU limit first)."""


def wall_backstop_s(timeout_s: float) -> float:
    """Wall-clock seconds after which a worker still on one item is killed (its verdict ``"timeout"``)."""
    return WALL_BACKSTOP_FACTOR * timeout_s
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Spawner:
    """Starts worker processes from one long-lived daemon thread.

    Linux's ``PR_SET_PDEATHSIG`` (set by each worker) fires when the *thread* that started
    the worker exits, so workers must not be started by a short-lived caller thread.
    """

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, *args, **kwargs) -> subprocess.Popen:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="rewards-spawner", daemon=True)
                self._thread.start()
        reply: queue.SimpleQueue = queue.SimpleQueue()
        self._requests.put((reply, args, kwargs))
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    def _loop(self) -> None:
        while True:
            reply, args, kwargs = self._requests.get()
            try:
                reply.put((True, subprocess.Popen(*args, **kwargs)))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                reply.put((False, e))


_SPAWNER = _Spawner()


class _Worker:
    __slots__ = ("proc", "send_conn", "recv_conn", "ready", "task", "deadline", "done")

    def __init__(self, proc: subprocess.Popen, send_conn: Connection, recv_conn: Connection):
        self.proc = proc
        self.send_conn = send_conn
        self.recv_conn = recv_conn
        self.ready = False
        self.task: int | None = None
        self.deadline = 0.0
        self.done = 0


KINDS = ("math", "gym")
"""The checkers a worker can run (`rewards._worker`)."""


class VerifierPool:
    """`workers` processes running one checker (``kind``) with a hard per-item time limit.

    Args:
        workers: number of processes (>= 1).
        memory_limit_bytes: address-space cap per worker (None: no cap).
        max_tasks: items a worker checks before it is replaced.
        kind: ``math`` (math-verify's `verify_pair`) or ``gym`` (reasoning-gym's ``score_answer``).

    Raises:
        ValueError: ``workers`` < 1 or an unknown ``kind``.

    Thread-safe: concurrent `map` calls run one after the other.
    """

    def __init__(self, workers: int = 2, memory_limit_bytes: int | None = 4 << 30, max_tasks: int = 2000,
                 kind: str = "math"):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        self.n_workers = workers
        self.memory_limit_bytes = memory_limit_bytes
        self.max_tasks = max_tasks
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._fatal: str | None = None  # why workers cannot start; every item is then "error"
        self._early_deaths = 0

    # -- worker life cycle ------------------------------------------------------------
    def _start(self) -> _Worker:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            proc = _SPAWNER.popen(
                [
                    sys.executable, "-m", "rewards._worker",
                    str(to_child_r), str(from_child_w), str(self.memory_limit_bytes or 0), str(os.getpid()),
                    self.kind,
                ],
                pass_fds=(to_child_r, from_child_w),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
                cwd=_PACKAGE_ROOT,
                close_fds=True,
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        return _Worker(proc, Connection(to_child_w, readable=False), Connection(from_child_r, writable=False))

    @staticmethod
    def _stop(w: _Worker, graceful: bool = False) -> None:
        if graceful and w.proc.poll() is None:
            try:
                w.send_conn.send(None)
                w.proc.wait(0.5)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        if w.proc.poll() is None:
            w.proc.kill()
        try:
            w.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            pass
        w.send_conn.close()
        w.recv_conn.close()

    def _replace(self, w: _Worker, graceful: bool = False) -> None:
        self._stop(w, graceful)
        self._workers[self._workers.index(w)] = self._start()

    def close(self) -> None:
        """Stop all workers (the next `map` starts new ones)."""
        with self._lock:
            for w in self._workers:
                self._stop(w, graceful=True)
            self._workers = []

    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (for tests and monitoring)."""
        return [w.proc.pid for w in self._workers]

    # -- the batch loop ---------------------------------------------------------------
    def map(self, tasks: list[tuple], timeout_s: float) -> list:
        """Check items; one result per item, in order.

        Args:
            tasks: ``math``: ``(extracted answer, reference)`` pairs; ``gym``: ``(answer or None,
                dataset name, reference)`` triples.
            timeout_s: limit per item in seconds of the worker's CPU time (user + system), with a
                wall-clock backstop of :func:`wall_backstop_s` from when the item reaches a ready worker.

        Returns:
            ``math``: ``"correct"``, ``"wrong"`` or ``"ref_error"``; ``gym``: the score (float) or
            ``"ref_error"``; either kind: ``"timeout"`` or ``"error"``.
        """
        if not tasks:
            return []
        results: list[str | None] = [None] * len(tasks)
        with self._lock:
            if self._fatal is not None:
                return ["error"] * len(tasks)
            try:
                while len(self._workers) < self.n_workers:
                    self._workers.append(self._start())
            except OSError as e:  # cannot start processes here at all
                self._fatal = f"cannot start a verifier worker: {e!r}"
                return ["error"] * len(tasks)
            self._run(tasks, timeout_s, results)
        return [r if r is not None else "error" for r in results]

    def _run(self, tasks: list[tuple], timeout_s: float, results: list) -> None:
        pending = deque(range(len(tasks)))
        startup_deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while pending or any(w.task is not None for w in self._workers):
            now = time.monotonic()
            for w in list(self._workers):
                if w.ready and w.task is None and pending:
                    i = pending.popleft()
                    try:
                        w.send_conn.send((i, timeout_s, *tasks[i]))
                    except (OSError, ValueError):  # it died while idle
                        pending.appendleft(i)
                        self._replace(w)
                        continue
                    w.task, w.deadline = i, now + wall_backstop_s(timeout_s)
            busy = [w for w in self._workers if w.task is not None]
            if busy:
                wait_s = max(0.0, min(w.deadline for w in busy) - now)
                startup_deadline = now + STARTUP_TIMEOUT_S
            elif now >= startup_deadline:
                return  # no worker became ready: the rest stay None -> "error"
            else:
                wait_s = startup_deadline - now
            readable = set(wait([w.recv_conn for w in self._workers], wait_s))
            for w in list(self._workers):
                if w.recv_conn not in readable:
                    continue
                try:
                    msg = w.recv_conn.recv()
                except (EOFError, OSError):  # it exited
                    if w.task is not None:
                        results[w.task] = "timeout"
                    elif not w.ready:
                        self._early_deaths += 1
                        if self._early_deaths > 3 * self.n_workers:
                            self._fatal = f"verifier workers exit during start-up (exit code {w.proc.poll()})"
                    self._replace(w)
                    continue
                if msg[0] == "ready":
                    w.ready = True
                elif msg[0] == "fatal":
                    self._fatal = f"verifier worker cannot import its {self.kind} checker: {msg[1]}"
                elif w.task == msg[0]:
                    results[msg[0]] = msg[1]
                    w.task = None
                    w.done += 1
                    if w.done >= self.max_tasks:
                        self._replace(w, graceful=True)
            if self._fatal is not None:
                for w in self._workers:
                    self._stop(w)
                self._workers = []
                return
            now = time.monotonic()
            for w in list(self._workers):
                if w.task is not None and now >= w.deadline:
                    results[w.task] = "timeout"
                    w.task = None
                    self._replace(w)


_POOLS: dict[tuple[int, int | None, str], VerifierPool] = {}
_POOLS_LOCK = threading.Lock()


def get_pool(workers: int = 2, memory_limit_bytes: int | None = 4 << 30, kind: str = "math") -> VerifierPool:
    """The process-wide pool for these settings and checker ``kind``, created on first use (starts no process)."""
    key = (workers, memory_limit_bytes, kind)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = VerifierPool(workers, memory_limit_bytes, kind=kind)
        return pool


def shutdown() -> None:
    """Stop every pool's workers (registered with `atexit`)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
    for pool in pools:
        pool.close()


def _forget_after_fork() -> None:
    # A forked child must not talk to its parent's workers: it starts from no pools.
    global _POOLS_LOCK, _SPAWNER
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()
    _SPAWNER = _Spawner()


atexit.register(shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
