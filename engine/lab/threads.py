"""One BLAS thread for the lab: its matrices are small, and a busy machine makes threads spin.

Measured on the 2-core shared Xeon (load average 3, 2026-12-02): pycma's eigendecomposition of a
240 x 240 covariance took 0.66 s with numpy's OpenBLAS on 2 threads against 4 ms on one, so a lab
run of 600 generations went from minutes to seconds. OpenBLAS reads ``OPENBLAS_NUM_THREADS`` only
when it loads, which numpy has done long before a command runs (the CLI imports the strategies), so
:func:`one_blas_thread` sets the count through OpenBLAS's own ``*_set_num_threads`` entry point
(the mechanism of threadpoolctl, which essa does not depend on) and restores it afterwards. Where no
OpenBLAS is found (another BLAS, another OS) it does nothing.
"""
from __future__ import annotations

import ctypes
import glob
import os
from contextlib import contextmanager

_PAIRS = (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
          ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
          ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
          ("openblas_get_num_threads", "openblas_set_num_threads"))


def _openblas_libraries() -> list:
    """(get, set) function pairs of the OpenBLAS copies numpy and scipy ship (their ``*.libs`` folders)."""
    import numpy

    site = os.path.dirname(os.path.dirname(numpy.__file__))
    out = []
    for path in sorted(glob.glob(os.path.join(site, "*.libs", "*openblas*.so*"))):
        try:
            lib = ctypes.CDLL(path)  # already loaded by numpy/scipy: the same handle
        except OSError:
            continue
        for get, set_ in _PAIRS:
            if hasattr(lib, get) and hasattr(lib, set_):
                out.append((getattr(lib, get), getattr(lib, set_)))
                break
    return out


@contextmanager
def one_blas_thread():
    """Run the body with one OpenBLAS thread in numpy's and scipy's copies; restore the counts after."""
    libs = _openblas_libraries()
    before = [get() for get, _ in libs]
    for _, set_ in libs:
        set_(1)
    try:
        yield
    finally:
        for (_, set_), n in zip(libs, before):
            set_(int(n))
