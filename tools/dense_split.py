"""The dense reward's per-token split on real splices, the old target against the new (issue 40 item 2).

Greedy rollouts of one adapter (default: the newest cached SFT warm start) on the first ``--n`` held-out
problems of a task; for each rollout the dense reward's context (rewards/likelihood.py) is spliced with
the reference answer and scored prefill-only by the same engine twice:

* old: the answer then a lone ``}`` token (the target before the fix: ``answer + "}"`` tokenised apart);
* new: the answer then the closing token the rollout itself wrote (e.g. ``}.``).

Prints, per splice and on average, the nats of the answer's tokens and of the closing token, and the
closing token's share of the total; with ``--json`` writes them too.

Usage::

    .venv/bin/python tools/dense_split.py [--adapter DIR] [--task gsm8k] [--n 20] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def newest_sft() -> Path:
    """The newest cached SFT adapter (``$ESSA_CACHE/sft/<key>``). Raises FileNotFoundError when none."""
    from engine.model import cache_dir

    found = sorted((cache_dir() / "sft").glob("*/adapter_config.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError("no cached SFT adapter: run `make run` (or essa train) once, or pass --adapter DIR")
    return found[-1].parent


def splits(tok, backend, prompts, completions, answers, ref):
    """(old, new) lists of (answer nats, close nats) per splice."""
    from engine.evaluation.prefill import encode_answer_pairs, encode_pairs, target_logprobs
    from rewards.likelihood import answer_context

    cut = [answer_context(c, a) for c, a in zip(completions, answers)]
    prefixes = [p + ctx for p, (ctx, _, _) in zip(prompts, cut)]
    old = encode_pairs(tok, prefixes, [f"{a}}}" for _, a, _ in cut])
    new = encode_answer_pairs(tok, prefixes, [a for _, a, _ in cut], [c for _, _, c in cut])
    lps = target_logprobs(backend, old + new, [ref] * (2 * len(cut)))
    def parts(lp):
        return float(lp[:-1].sum()), float(lp[-1])
    return [parts(lp) for lp in lps[: len(cut)]], [parts(lp) for lp in lps[len(cut):]], [c for _, _, c in cut]


def main() -> None:
    """Generate, splice, score old and new targets; print the per-token split."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adapter", type=Path, default=None, help="PEFT adapter dir (default: newest cached SFT)")
    ap.add_argument("--task", default="gsm8k")
    ap.add_argument("--n", type=int, default=20, help="held-out problems (one greedy rollout each)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from omegaconf import OmegaConf

    from engine.backends import AdapterRef, Sampling, lora_int_id
    from engine.backends.vllm_local import VLLMBackend
    from engine.config import TaskConfig
    from engine.model import resolve_model_path
    from engine.prompts import build_prompt
    from engine.tasks import load_task

    adapter = args.adapter or newest_sft()
    task_cfg = OmegaConf.merge(OmegaConf.structured(TaskConfig), OmegaConf.load(ROOT / "conf" / "task" / f"{args.task}.yaml"))
    task_cfg.val_size = args.n
    problems = load_task(task_cfg).val[: args.n]
    backend = VLLMBackend(resolve_model_path("embedded:smollm2-135m-instruct"), max_loras=1, kv_cache_gib=1,
                          max_lora_rank=16)
    try:
        tok = backend.tokenizer
        prompts = [build_prompt(tok, p.question, TaskConfig.system_prompt) for p in problems]
        ref = AdapterRef("warm", lora_int_id(-1, 0), str(adapter))
        outs = backend.generate(prompts, [ref] * len(prompts), Sampling(max_tokens=args.max_tokens, temperature=0.0))
        old, new, closes = splits(tok, backend, prompts, [o[0].text for o in outs], [p.answer for p in problems], ref)
    finally:
        backend.close()
    print(f"adapter {adapter}; {len(problems)} splices of {args.task} (greedy rollouts)")
    print(f"{'#':>3} {'close written':>14} {'old answer':>10} {'old }':>8} {'new answer':>10} {'new close':>9}")
    for i, ((oa, oc), (na, nc), c) in enumerate(zip(old, new, closes)):
        print(f"{i:>3} {c[:12]!r:>14} {oa:>10.3f} {oc:>8.3f} {na:>10.3f} {nc:>9.3f}")
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    for name, rows in (("old", old), ("new", new)):
        a, c = mean([r[0] for r in rows]), mean([r[1] for r in rows])
        share = mean([r[1] / (r[0] + r[1]) if r[0] + r[1] < 0 else 0.0 for r in rows])
        print(f"{name}: answer tokens {a:.3f} nats, closing token {c:.3f} nats, closing share {share:.1%}")
    if args.json:
        from engine.io import write_json

        write_json(args.json, {"adapter": str(adapter), "task": args.task, "old": old, "new": new, "closes": closes})


if __name__ == "__main__":
    main()
