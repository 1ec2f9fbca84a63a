"""Checkpoint cost of the CMA-ES strategy state at ESSA's genome sizes (issue 16, item 5).

The run loop writes ``checkpoint.pkl`` (engine/io.py ``write_pickle``: pickle, fsync, rename)
after EVERY generation, and the strategy state is most of it: full-covariance pycma keeps C and
its eigenbasis B, 2 x D^2 float64 (59 MB at D 1920, 206 MB at D 3584). This script measures, per
genome length D and covariance kind (full / separable), after a few real ask/tell generations:

* ``bytes``: size of the pickled ``strategy.state_dict()``;
* ``write_s``: ``state_dict()`` + ``engine.io.write_pickle`` (fsync'ed) into ``--dir``;
* ``read_s``: ``engine.io.read_pickle`` + ``load_state_dict`` into a fresh strategy (resume);
* ``ask_tell_s``: one generation's ``ask`` + ``tell`` (P = 16), for scale;

medians over ``--repeats``, and which kind ``strategy=essa`` picks at that D (``diagonal: auto``
since issue 16; it was always full before). Budget: everything outside generation should stay
within 5 % of a generation, which takes ~15-60 s on the project's CPU machine.

    python tools/bench_checkpoint.py                     # D 1920 and 3584, into a temp dir
    python tools/bench_checkpoint.py --dims 1920 3584 7168 --dir outputs/ckpt-bench
"""
from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from engine import io
from strategies.cma_es import AUTO_DIAGONAL_DIM, CMAES


def measure(dim: int, diagonal: bool, out_dir: Path, repeats: int, generations: int, population: int = 16) -> dict:
    """Checkpoint bytes and seconds of one CMA-ES state (module docstring). Seconds are medians."""
    rng = np.random.default_rng(0)
    es = CMAES(dim=dim, x0=None, seed=0, population_size=population, sigma0=0.1, diagonal=diagonal)
    ask_tell = []
    for _ in range(generations):
        t0 = time.perf_counter()
        genomes = es.ask()                                         # (P, D)
        es.tell(genomes, rng.standard_normal(population))          # (P,)
        ask_tell.append(time.perf_counter() - t0)
    path = out_dir / f"checkpoint-{dim}-{'diag' if diagonal else 'full'}.pkl"
    writes, reads = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        io.write_pickle(path, {"strategy": es.state_dict()})
        writes.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fresh = CMAES(dim=dim, x0=None, seed=0, population_size=population, sigma0=0.1, diagonal=diagonal)
        fresh.load_state_dict(io.read_pickle(path)["strategy"])
        reads.append(time.perf_counter() - t0)
    assert np.array_equal(fresh.ask(), es.ask()), "resumed strategy samples differently"
    size = path.stat().st_size
    path.unlink()
    return {"D": dim, "kind": "diagonal" if diagonal else "full", "bytes": size,
            "write_s": statistics.median(writes), "read_s": statistics.median(reads),
            "ask_tell_s": statistics.median(ask_tell[1:] or ask_tell)}


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (or platform's guess)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> list[dict]:
    """Measure and print the table; returns its rows."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[1920, 3584], help="genome lengths D")
    ap.add_argument("--dir", type=Path, default=None, help="where checkpoints are written (default: a temp dir)")
    ap.add_argument("--repeats", type=int, default=3, help="write/read repetitions (median)")
    ap.add_argument("--generations", type=int, default=3, help="ask/tell generations before measuring")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = [measure(d, diag, Path(tmp), args.repeats, args.generations) for d in args.dims for diag in (False, True)]
    print(f"machine: {cpu_name()}; checkpoint dir {args.dir or tempfile.gettempdir()}; P=16; medians of {args.repeats}")
    print(f"strategy=essa: diagonal=auto (separable when D > {AUTO_DIAGONAL_DIM}); before issue 16: always full")
    print(f"{'D':>6} {'kind':>9} {'MB':>8} {'write s':>8} {'read s':>8} {'ask+tell s':>10}  essa before / after")
    for r in rows:
        after = "diagonal" if r["D"] > AUTO_DIAGONAL_DIM else "full"
        pick = ("before" if r["kind"] == "full" else "") + ("/after" if r["kind"] == after else "")
        print(f"{r['D']:>6} {r['kind']:>9} {r['bytes'] / 1e6:>8.2f} {r['write_s']:>8.3f} {r['read_s']:>8.3f} "
              f"{r['ask_tell_s']:>10.3f}  {pick.strip('/') or '-'}")
    return rows


if __name__ == "__main__":
    main()
