"""Entry point of one verifier worker process: ``python -m rewards._worker IN OUT MEM PPID [KIND]``.

The parent (`rewards._pool`) starts it with `subprocess.Popen` and two private pipes (file
descriptors IN and OUT, passed with ``pass_fds``); messages are `multiprocessing.connection`
frames. Receives ``(index, cpu_limit_s, *item)`` and answers ``(index, result)``; ``None`` or EOF
stops it. An item may use ``cpu_limit_s`` seconds of this process's CPU time (user + system), so
its verdict does not depend on how loaded the machine is: a profiling timer (``ITIMER_PROF``,
which counts CPU time) raises in the check at the limit and the answer is ``"timeout"``; a check
stuck in C code, where Python cannot raise, is ended by the kernel 2 s of CPU later (``RLIMIT_CPU``,
SIGXCPU), which the parent also records as ``"timeout"``. The parent keeps a wall-clock backstop
for a check that hangs without using CPU. KIND (default ``math``) picks the checker: ``math`` checks ``(pred, ref)`` with
`rewards._verify_impl.verify_pair`, ``gym`` scores ``(answer, dataset, ref)`` with the
reasoning-gym dataset's own verifier (`rewards._gym_impl.score`). The worker caps its
address space at MEM bytes (0: no cap) and asks Linux to kill it when its parent dies
(``PR_SET_PDEATHSIG``), so a worker stuck in a huge sympy computation cannot outlive the run.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from multiprocessing.connection import Connection


def _die_with_parent(ppid: int) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux
        pass
    if os.getppid() != ppid:  # the parent died before prctl took effect
        os._exit(0)


def _limit_memory(limit_bytes: int) -> None:
    if limit_bytes <= 0:
        return
    try:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit_bytes = min(limit_bytes, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, hard))
    except (ImportError, ValueError, OSError):
        pass


class _CpuLimit(BaseException):
    """An item's CPU time reached its limit (a BaseException: checkers' ``except Exception`` let it pass)."""


def _on_cpu_limit(signum, frame) -> None:
    raise _CpuLimit


def _no_core_files() -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (ImportError, ValueError, OSError):
        pass


def _kernel_cpu_stop(cpu_limit_s: float) -> None:
    """Let the kernel end this process (SIGXCPU) 2 s of CPU after the item's limit: the backstop for a check
    stuck in C code, where the timer's exception cannot be raised."""
    try:
        import math
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = math.ceil(usage.ru_utime + usage.ru_stime + cpu_limit_s + 2.0)
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
    except (ImportError, ValueError, OSError):
        pass


def check_within(check, item: tuple, cpu_limit_s: float):
    """``check(*item)`` with at most ``cpu_limit_s`` seconds of this process's CPU time (main thread only).

    Returns:
        The checker's result, ``"timeout"`` at the limit, ``"wrong"`` on any other exception (sympy bugs,
        MemoryError, RecursionError).
    """
    _kernel_cpu_stop(cpu_limit_s)
    try:
        # fires at the limit, then every 0.1 CPU-s again in case a checker's bare except swallowed it
        signal.setitimer(signal.ITIMER_PROF, cpu_limit_s, 0.1)
        try:
            return check(*item)
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0.0)
    except _CpuLimit:
        return "timeout"
    except BaseException:  # noqa: BLE001 - MemoryError, RecursionError, sympy bugs
        return "wrong"


def _checker(kind: str):
    """The check function of ``kind``, imported and warmed up (first parses build caches: no item's
    time limit should pay for them)."""
    if kind == "gym":
        from rewards import _gym_impl

        _gym_impl.warm_up()
        return _gym_impl.score
    from rewards import _verify_impl

    _verify_impl.verify_pair(r"\frac{\sqrt{2}}{2}", r"\{1, (0, 1]\}")
    return _verify_impl.verify_pair


def main(argv: list[str]) -> int:
    """Run the worker loop; returns the exit code."""
    fd_in, fd_out, mem, ppid = (int(a) for a in argv[1:5])
    kind = argv[5] if len(argv) > 5 else "math"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    signal.signal(signal.SIGPROF, _on_cpu_limit)
    _no_core_files()
    warnings.filterwarnings("ignore")  # sympy deprecation noise would flood the parent's stderr
    _die_with_parent(ppid)
    _limit_memory(mem)
    conn_in = Connection(fd_in, writable=False)
    conn_out = Connection(fd_out, readable=False)
    try:
        check = _checker(kind)
    except BaseException as e:  # noqa: BLE001 - report any import failure to the parent
        conn_out.send(("fatal", repr(e)))
        return 1
    conn_out.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn_in.recv()
        except (EOFError, OSError):
            return 0
        if msg is None:
            return 0
        index, cpu_limit_s, *item = msg
        status = check_within(check, tuple(item), cpu_limit_s)
        try:
            conn_out.send((index, status))
        except (OSError, ValueError):
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
