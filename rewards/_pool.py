"""A small process pool with a hard time limit per item, for math-verify checks.

Why not `concurrent.futures.ProcessPoolExecutor`: it cannot stop one running task, so a
single hung sympy call (``5^{5^{5^5}}``) would block a worker for ever and the only way out
is to tear down the whole executor. Here every worker is a `multiprocessing.Process` with
its own pipe and at most one task in flight; the parent waits on all pipes and process
sentinels with `multiprocessing.connection.wait` and a deadline, and a worker past its
deadline is SIGKILLed and replaced. This works from any thread (no signals in the parent)
and from inside other worker processes.

Start method: ``forkserver`` where available, with `rewards._verify_impl` preloaded so that a
replacement worker is a cheap fork of a process that has already imported sympy; otherwise
``spawn``. Never ``fork``: the parent may hold CUDA contexts and threads (vLLM, torch).
Workers start lazily, on the first item that needs them; importing `rewards` starts nothing.
The time limit of an item counts from when it is sent to a ready worker, so worker start-up
(import of sympy) is never charged to an item. Each worker caps its address space
(``RLIMIT_AS``) and is recycled after `max_tasks` items to bound sympy's caches.

Statuses returned per item: those of `rewards._verify_impl.verify_pair` plus ``"timeout"``
(over the limit, or the worker died while checking this item) and ``"error"`` (no worker
could be started).
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import threading
import time
from collections import deque
from multiprocessing.connection import wait

STARTUP_TIMEOUT_S = 120.0  # seconds a batch waits for a first worker before giving up
_PRELOAD = ["rewards._verify_impl"]


def _limit_memory(limit_bytes: int | None) -> None:
    if not limit_bytes:
        return
    try:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit_bytes = min(limit_bytes, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, hard))
    except (ImportError, ValueError, OSError):  # not POSIX, or a lower limit is already set
        pass


def worker_main(conn, memory_limit_bytes: int | None) -> None:
    """Worker loop: receive ``(index, pred, ref)``, answer ``(index, status)``; None stops."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    _limit_memory(memory_limit_bytes)
    try:
        from rewards import _verify_impl
    except BaseException as e:  # noqa: BLE001 - report any import failure to the parent
        conn.send(("fatal", repr(e)))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        index, pred, ref = msg
        try:
            status = _verify_impl.verify_pair(pred, ref)
        except BaseException:  # noqa: BLE001 - MemoryError, RecursionError, sympy bugs
            status = "wrong"
        try:
            conn.send((index, status))
        except (OSError, ValueError):
            return


def _context():
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)  # only used if the fork server is not running yet
        return ctx
    return mp.get_context("spawn")


class _Worker:
    __slots__ = ("proc", "conn", "ready", "task", "deadline", "done")

    def __init__(self, proc, conn):
        self.proc = proc
        self.conn = conn
        self.ready = False
        self.task: int | None = None
        self.deadline = 0.0
        self.done = 0


class VerifierPool:
    """`workers` processes running `verify_pair` with a hard per-item time limit.

    Args:
        workers: number of processes (>= 1).
        memory_limit_bytes: address-space cap per worker (None: no cap).
        max_tasks: items a worker checks before it is replaced.

    Thread-safe: concurrent `map` calls run one after the other.
    """

    def __init__(self, workers: int = 2, memory_limit_bytes: int | None = 4 << 30, max_tasks: int = 2000):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.n_workers = workers
        self.memory_limit_bytes = memory_limit_bytes
        self.max_tasks = max_tasks
        self._ctx = None
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._fatal: str | None = None  # why workers cannot start; every item is then "error"
        self._early_deaths = 0

    # -- worker life cycle ------------------------------------------------------------
    def _start(self) -> _Worker:
        if self._ctx is None:
            self._ctx = _context()
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=worker_main, args=(child, self.memory_limit_bytes), daemon=True, name="rewards-verifier"
        )
        proc.start()
        child.close()
        return _Worker(proc, parent)

    @staticmethod
    def _stop(w: _Worker, graceful: bool = False) -> None:
        if graceful and w.proc.is_alive():
            try:
                w.conn.send(None)
                w.proc.join(0.5)
            except (OSError, ValueError):
                pass
        if w.proc.is_alive():
            w.proc.kill()
        w.proc.join(5.0)
        w.conn.close()

    def _replace(self, w: _Worker, graceful: bool = False) -> None:
        self._stop(w, graceful)
        self._workers[self._workers.index(w)] = self._start()

    def close(self) -> None:
        """Stop all workers (they are restarted by the next `map`)."""
        with self._lock:
            for w in self._workers:
                self._stop(w, graceful=True)
            self._workers = []

    # -- the batch loop ---------------------------------------------------------------
    def map(self, tasks: list[tuple[str, str]], timeout_s: float) -> list[str]:
        """Check ``(pred, ref)`` pairs; one status per pair, in order.

        Args:
            tasks: ``(extracted answer, reference)`` pairs.
            timeout_s: hard limit per pair in seconds, counted from when the pair reaches a
                ready worker.

        Returns:
            ``"correct"``, ``"wrong"``, ``"ref_error"``, ``"timeout"`` or ``"error"`` per pair.
        """
        results: list[str | None] = [None] * len(tasks)
        if not tasks:
            return []
        with self._lock:
            if self._fatal is not None:
                return ["error"] * len(tasks)
            while len(self._workers) < self.n_workers:
                self._workers.append(self._start())
            pending = deque(range(len(tasks)))
            startup_deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while pending or any(w.task is not None for w in self._workers):
                now = time.monotonic()
                for w in list(self._workers):
                    if w.ready and w.task is None and pending:
                        i = pending.popleft()
                        try:
                            w.conn.send((i, *tasks[i]))
                        except (OSError, ValueError):
                            pending.appendleft(i)
                            self._replace(w)
                            continue
                        w.task, w.deadline = i, now + timeout_s
                busy = [w for w in self._workers if w.task is not None]
                if busy:
                    wait_s = max(0.0, min(w.deadline for w in busy) - now)
                    startup_deadline = now + STARTUP_TIMEOUT_S
                elif now >= startup_deadline:
                    for i in pending:
                        results[i] = "error"
                    break
                else:
                    wait_s = startup_deadline - now
                handles = [w.conn for w in self._workers] + [w.proc.sentinel for w in self._workers]
                ready = set(wait(handles, wait_s))
                for w in list(self._workers):
                    msg = None
                    if w.conn in ready:
                        try:
                            msg = w.conn.recv()
                        except (EOFError, OSError):
                            msg = None
                    if msg is not None:
                        if msg[0] == "ready":
                            w.ready = True
                        elif msg[0] == "fatal":
                            self._fatal = str(msg[1])
                        else:
                            i, status = msg
                            if w.task == i:
                                results[i] = status
                                w.task = None
                                w.done += 1
                                if w.done >= self.max_tasks:
                                    self._replace(w, graceful=True)
                        continue
                    if w.conn in ready or w.proc.sentinel in ready:  # EOF or exit: it died
                        if w.task is not None:
                            results[w.task] = "timeout"
                        elif not w.ready:
                            self._early_deaths += 1
                            if self._early_deaths > 3 * self.n_workers:
                                self._fatal = f"workers exit during start-up (exit code {w.proc.exitcode})"
                        self._replace(w)
                if self._fatal is not None:
                    for i in list(pending) + [w.task for w in self._workers if w.task is not None]:
                        results[i] = "error"
                    for w in self._workers:
                        self._stop(w)
                    self._workers = []
                    break
                now = time.monotonic()
                for w in list(self._workers):
                    if w.task is not None and now >= w.deadline:
                        results[w.task] = "timeout"
                        w.task = None
                        self._replace(w)
        return [r if r is not None else "error" for r in results]


_POOLS: dict[tuple[int, int | None], VerifierPool] = {}
_POOLS_LOCK = threading.Lock()


def get_pool(workers: int = 2, memory_limit_bytes: int | None = 4 << 30) -> VerifierPool:
    """The process-wide pool for these settings, created on first use (starts no process)."""
    key = (workers, memory_limit_bytes)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = VerifierPool(workers, memory_limit_bytes)
        return pool


def shutdown() -> None:
    """Stop every pool's workers (registered with `atexit`)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
    for pool in pools:
        pool.close()


def _forget_after_fork() -> None:
    # A forked child must not talk to its parent's workers: start from no pools.
    global _POOLS_LOCK
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()


atexit.register(shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
