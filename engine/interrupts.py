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
whatever disposition the process inherited; :func:`requested` tells later code that an exception
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


def requested() -> bool:
    """True once SIGINT reached this process while :func:`handling` was active."""
    return _count > 0


def reset() -> None:
    """Forget recorded interrupts (tests)."""
    global _count
    _count = 0


def _on_sigint(signum, frame) -> None:
    global _count
    _count += 1
    raise KeyboardInterrupt


@contextlib.contextmanager
def handling():
    """Within the block, SIGINT raises ``KeyboardInterrupt`` in the main thread and is recorded,
    even where the process inherited SIGINT ignored; the previous handler is restored afterwards.
    A no-op outside the main thread (Python allows signal handlers only there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


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
