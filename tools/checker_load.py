"""How close the slowest legitimate answer checks come to ``reward.timeout_s``, with the cores saturated.

Runs math-verify's check (``rewards._verify_impl.verify_pair``, what a pool worker runs) on legitimate
pairs, each timed in CPU seconds (``time.process_time``: what the worker's limit counts since issue 40)
and wall seconds, while ``--busy`` Python busy loops load the machine:

* every MATH-500 reference (``$ESSA_DATA``, default ../shared/data) (Hendrycks et al. 2021, the 500-problem split of Lightman et al. 2023)
  checked against itself: the reference forms a run meets, parsed and compared symbolically;
* the rows of tests/test_rewards.py's tables whose expected verdict is not ``timeout`` (equations
  rearranged, sets, intervals, units: the kinds of public-report answers).

Usage::

    .venv/bin/python tools/checker_load.py [--busy 2] [--limit 5.0] [--top 8]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _busy() -> None:
    while True:
        pass


def legitimate_pairs() -> list[tuple[str, str]]:
    """(answer, reference) pairs whose check should end in a verdict, not a timeout."""
    sys.path.insert(0, str(ROOT))
    from engine.tasks import default_data_root

    math500 = default_data_root() / "math500" / "test.jsonl"
    rows = [json.loads(line) for line in math500.read_text().splitlines() if line.strip()]
    pairs = [(r["answer"], r["answer"]) for r in rows]
    from rewards.extract import extract_answer
    from tests.test_rewards import CASES, KIND_ROWS

    for completion, reference, status, *_ in CASES + [row[1:] for row in KIND_ROWS]:
        answer = extract_answer(completion)
        if status != "timeout" and isinstance(answer, str) and isinstance(reference, str):
            pairs.append((answer, reference))
    return pairs


def main() -> None:
    """Time every legitimate check under load; print the slowest and the largest share of the limit."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--busy", type=int, default=2, help="busy-loop processes beside the checks")
    ap.add_argument("--limit", type=float, default=5.0, help="reward.timeout_s to compare with (s)")
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    from rewards._verify_impl import verify_pair

    pairs = legitimate_pairs()
    verify_pair("1", "1")  # warm-up, as a worker does before it reports ready
    loads = [mp.Process(target=_busy, daemon=True) for _ in range(args.busy)]
    for p in loads:
        p.start()
    timed = []
    try:
        for answer, reference in pairs:
            c0, w0 = time.process_time(), time.perf_counter()
            verdict = verify_pair(answer, reference)
            timed.append((time.process_time() - c0, time.perf_counter() - w0, verdict, answer, reference))
    finally:
        for p in loads:
            p.kill()
    timed.sort(reverse=True)
    print(f"{len(timed)} legitimate checks, {args.busy} busy loops beside them")
    for cpu, wall, verdict, answer, reference in timed[:args.top]:
        print(f"  cpu {cpu:6.3f} s  wall {wall:6.3f} s  {verdict:9s}  {answer[:40]!r} vs {reference[:40]!r}")
    cpu, wall = timed[0][0], max(t[1] for t in timed)
    print(f"slowest: {cpu:.3f} CPU-s = {100 * cpu / args.limit:.1f} % of reward.timeout_s={args.limit}; "
          f"largest wall time {wall:.3f} s ({100 * wall / args.limit:.1f} % of it as a wall-clock limit)")


if __name__ == "__main__":
    main()
