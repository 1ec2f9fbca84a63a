"""Benchmark `rewards.reward` on GSM8K-style completions (issue #3: 10,000 in under 10 s).

Completions are built from real GSM8K test solutions (Cobbe et al. 2021,
arXiv 2110.14168): calculator annotations ``<<...>>`` removed and the closing ``#### N``
rewritten as ``The final answer is \\boxed{N}.``, in four variants by row index:

======  ==========================================  =================
share   variant                                     expected status
======  ==========================================  =================
40 %    correct, boxed                              correct
30 %    boxed N + 1 (wrong)                         wrong
20 %    solution without its final line (unboxed)   no_answer
10 %    GSM8K's own ``#### N`` kept                 correct
======  ==========================================  =================

All of these take the in-process numeric path; ``--symbolic K`` also times K LaTeX answers
that need math-verify in the worker pool (first call includes worker start-up).

Usage::

    .venv/bin/python tools/bench_rewards.py [--n 10000] [--repeats 3] [--symbolic 0]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k" / "test.jsonl"
_CALC_RE = re.compile(r"<<[^>]*>>")


def build(n: int, data: Path) -> tuple[list[str], list[str], list[str]]:
    """N completions, their references and expected statuses, from GSM8K solutions."""
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    completions, references, expected = [], [], []
    for i in range(n):
        sol = _CALC_RE.sub("", rows[i % len(rows)]["answer"])
        body, answer = sol.rsplit("####", 1)
        answer = answer.strip().replace(",", "")
        body = body.rstrip()
        kind = i % 10
        if kind < 4:
            text, status = f"{body}\nThe final answer is $\\boxed{{{answer}}}$.", "correct"
        elif kind < 7:
            text, status = f"{body}\nThe final answer is $\\boxed{{{int(answer) + 1}}}$.", "wrong"
        elif kind < 9:
            text, status = body.rsplit("\n", 1)[0] if "\n" in body else "I am not sure.", "no_answer"
        else:
            text, status = f"{body}\n#### {answer}", "correct"
        completions.append(text)
        references.append(answer)
        expected.append(status)
    return completions, references, expected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000, help="number of completions")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs after the first (cold) one")
    parser.add_argument("--symbolic", type=int, default=0, help="also time K answers that need math-verify")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="GSM8K jsonl file")
    args = parser.parse_args()

    t0 = time.perf_counter()
    import rewards

    t_import = time.perf_counter() - t0
    completions, references, expected = build(args.n, args.data)
    chars = sum(len(c) for c in completions) / len(completions)
    print(f"import rewards: {t_import * 1e3:.1f} ms; {args.n} completions, mean {chars:.0f} chars")

    times = []
    for run in range(1 + args.repeats):
        t0 = time.perf_counter()
        results = rewards.reward(completions, references)
        times.append(time.perf_counter() - t0)
        label = "cold (first call in process)" if run == 0 else f"repeat {run}"
        print(f"  {label:30s} {times[-1]:7.3f} s  {args.n / times[-1]:10,.0f} completions/s")
    got = [r.status for r in results]
    mismatches = sum(g != e for g, e in zip(got, expected))
    print(f"statuses: {dict(Counter(got))}; mismatches vs expected: {mismatches}")
    print(f"RESULT n={args.n} total_s={times[0]:.3f} completions_per_s={args.n / times[0]:,.0f} (cold)")

    if args.symbolic:
        k = args.symbolic
        sym = [f"So the result is $\\boxed{{\\frac{{\\sqrt{{{j + 2}}}}}{{{j % 7 + 2}}}}}$." for j in range(k)]
        refs = [f"\\frac{{1}}{{{j % 7 + 2}}}\\sqrt{{{j + 2}}}" for j in range(k)]
        t0 = time.perf_counter()
        res = rewards.reward(sym, refs)
        dt = time.perf_counter() - t0
        print(f"symbolic: {k} answers via math-verify pool in {dt:.2f} s ({k / dt:,.0f}/s, incl. worker start-up); "
              f"statuses {dict(Counter(r.status for r in res))}")


if __name__ == "__main__":
    main()
