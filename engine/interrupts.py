"""Ctrl-C for long runs: SIGINT always raises ``KeyboardInterrupt`` in the CLI process, and is remembered.

Two things made a Ctrl-C (or ``kill -INT``) of ``essa train`` unreliable:

* a process started in the background by a shell without job control (``cmd &`` in a script,
  ``nohup cmd &``, a CI runner's shell) inherits SIGINT *ignored*, and Python keeps an inherited
  ``SIG_IGN`` instead of installing its ``KeyboardInterrupt`` handler: the signal was silently
  dropped and the run went on to the end (exit 0);
* a Ctrl-C in a terminal reaches the whole process group, so vLLM's EngineCore child (which has a
  SIGINT handler of its own, vllm/v1/engine/core.py) shuts down too, and the main process may then
  fail with vLLM's ``EngineDeadError`` rather than ``KeyboardInterrupt``.

:func:`handling` installs a handler that records the signal and raises ``KeyboardInterrupt``
whatever disposition the process inherited, for SIGINT and for SIGTERM (what ``timeout``, ``docker
stop``, SLURM's ``scancel`` and Kubernetes send): without it a SIGTERM killed the main process at once
and left vLLM's engine processes running, holding their memory, and the candidates' adapters in
``/dev/shm``; now both signals take the same path (close the engine, print the resume line) and the
process exits with 128 + the signal's number (:func:`exit_status`); :func:`requested` tells later code that an exception
raised after that (``EngineDeadError``, a broken pipe to a dead worker) is the interrupt's
consequence, not a bug. :func:`sigterm_unwinds` lets a SIGTERM run the cleanups of a block (the SFT
warm start's temp directory) before the process ends by it.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading

_count = 0
_last = signal.SIGINT


def requested() -> bool:
    """True once SIGINT or SIGTERM reached this process while :func:`handling` was active."""
    return _count > 0


def reset() -> None:
    """Forget recorded interrupts (tests)."""
    global _count, _last
    _count = 0
    _last = signal.SIGINT


@contextlib.contextmanager
def redelivered(period_s: float = 2.0):
    """Within the block, an interrupt recorded by :func:`handling` that the block's code swallowed is
    delivered again (SIGINT to this process every ``period_s`` seconds) until the block ends.

    Why: vLLM's ``zmq_socket_ctx`` (vllm/utils/network_utils.py, 0.32) catches ``KeyboardInterrupt``
    around the engine's start-up handshake and only logs it, so a Ctrl-C while ``LLM(...)`` started
    its engine left the main process polling for the dead engine until VLLM_ENGINE_READY_TIMEOUT_S
    (600 s): the run hung until a second Ctrl-C. A no-op outside the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen, done = _count, threading.Event()

    def watch():
        while not done.wait(period_s):
            if _count > seen:
                os.kill(os.getpid(), signal.SIGINT)

    watcher = threading.Thread(target=watch, name="essa-interrupt-redelivery", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()


def exit_status() -> int:
    """The exit status of a run the last recorded signal stopped: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(_last)


def _on_signal(signum, frame) -> None:
    global _count, _last
    _count += 1
    _last = signum
    raise KeyboardInterrupt


@contextlib.contextmanager
def handling():
    """Within the block, SIGINT and SIGTERM raise ``KeyboardInterrupt`` in the main thread and are
    recorded, even where the process inherited SIGINT ignored; the previous handlers are restored
    afterwards. SIGTERM is taken only where it is at its default (not ignored, no other handler).
    A no-op outside the main thread (Python allows signal handlers only there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = [signal.SIGINT] + ([signal.SIGTERM] if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else [])
    previous = {s: signal.signal(s, _on_signal) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


class Terminated(BaseException):
    """SIGTERM within :func:`sigterm_unwinds` (a BaseException, like KeyboardInterrupt)."""


@contextlib.contextmanager
def sigterm_unwinds():
    """Within the block, SIGTERM unwinds the stack first (``finally`` blocks and context managers run:
    a temp directory is removed), then ends the process by SIGTERM as before (exit status -15 /
    143). Python's default lets SIGTERM kill the process at once, leaving such directories behind.
    A no-op outside the main thread or where SIGTERM is not at its default (ignored, or another
    handler owns it)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def on_sigterm(signum, frame):
        raise Terminated

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # delivered before kill() returns, unless blocked
        raise SystemExit(128 + signal.SIGTERM) from None
    finally:
        if signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
