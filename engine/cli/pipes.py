"""Output into a pipe whose reader stopped early (``essa help | head -1``): the command ends quietly.

Python ignores SIGPIPE, so a write to a pipe nobody reads any more raises BrokenPipeError wherever it
happens: in ``print``, in Hydra's ``--cfg``/``--help`` output (which Hydra's own error report then prints
as a traceback), or in the interpreter's last flush of stdout ("Exception ignored ..."). Every write and
flush of stdout goes through :class:`PipeGuard` while a command runs, and the first failure ends the
process with :data:`SIGPIPE_STATUS` and nothing on stderr, as a C tool killed by SIGPIPE.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager

SIGPIPE_STATUS = 141
"""Exit status when stdout's reader has gone: 128 + SIGPIPE (13), what a shell reports for a tool killed by it."""


def end_on_closed_pipe() -> None:
    """Exit with :data:`SIGPIPE_STATUS`, no traceback. stdout is pointed at /dev/null first, so the
    interpreter's final flush of what is still buffered does not fail a second time (the recipe of
    Python's ``signal`` documentation, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno())
    except (OSError, ValueError, AttributeError):  # stdout closed or not a file: nothing left to flush into it
        pass
    sys.exit(SIGPIPE_STATUS)


class PipeGuard:
    """A stand-in for a text stream whose ``write`` and ``flush`` end the process quietly on
    BrokenPipeError (:func:`end_on_closed_pipe`); everything else goes to the stream itself."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            end_on_closed_pipe()

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            end_on_closed_pipe()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextmanager
def closed_pipe_ends_quietly():
    """Run the body with stdout behind a :class:`PipeGuard`, flushed at the end (where a closed pipe
    shows when everything fitted in the buffer); stdout is put back afterwards."""
    real = sys.stdout
    guard = sys.stdout = PipeGuard(real)
    try:
        yield
        guard.flush()
    except BrokenPipeError:  # a write that bypassed the guard (a handle to the real stream taken before)
        end_on_closed_pipe()
    finally:
        if sys.stdout is guard:
            sys.stdout = real
