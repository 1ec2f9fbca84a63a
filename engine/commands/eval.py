"""``essa eval``: greedy accuracy, avg@n and pass@k of a base model with and without PEFT adapters.

Conditions are the base model (``no_adapter``, unless ``include_base=false``) and every adapter
named in ``adapters`` (an adapter directory, or a run directory whose ``adapters/mean`` and
``adapters/best`` are taken). Each pass puts every (condition, problem) request into ONE multi-LoRA
vLLM batch (the same engine and reward as training, engine/backends/vllm_local.py, rewards/):

1. greedy (temperature 0, one completion per problem) -> greedy accuracy;
2. when ``n > 1``: n samples per problem at ``temperature`` -> avg@n (mean accuracy over the
   samples) and pass@k for every k in ``ks`` with the unbiased estimator of Chen et al. 2021
   (arXiv 2107.03374, Eq. 1; engine/results/passk.py). F-GRPO (arXiv 2602.06717) reports pass@256 this way.

The pass@k study (issue 44): the sampled pass draws with common random numbers, sample g of problem i
from the same seed under every condition (request seed ``seed + crc32(prompt)``, ``Sampling.common_seeds``;
vLLM seeds sample g of a request with seed + g), so conditions differ by their weights, not by their dice.
Every condition other than ``control`` gets its pass@k difference against the control, and with three
or more conditions every pair of the others is compared too, each with a paired bootstrap interval over
the problems both score (engine/results/passk_compare.py); each condition's pass@k gets the bootstrap
interval of its mean over problems.

A sample counts as solved when its reward status is ``correct``; ``timeout`` (the completion made the
checker hang) counts as unsolved; ``error`` (the reference cannot be scored) is left out of n, never
scored 0 (docs/ARCHITECTURE.md).

Two accuracies, as GSM8K harnesses report them (lm-evaluation-harness: ``strict-match`` and
``flexible-extract``): *strict* is the training reward (``cfg.reward``: an answer marker such as
``\boxed{}``, ``####`` or "The answer is" is required); *flexible* scores the same completions with
``lenient=True`` (the marked answer when there is one, else the last number of the completion;
rewards/extract.py), so a base model that does not mark its answer is measured fairly. Every metric
without ``flexible`` in its name is strict.

Outputs in the run directory (Hydra's, or ``output_dir``):

| file | content |
|---|---|
| ``eval_problems.parquet`` | one row per (condition, problem), columns below |
| ``eval_summary.json`` | settings and, per condition, ``greedy_accuracy, greedy_accuracy_flexible, avg_at_n, avg_at_n_flexible, pass_at_k {k: value}, pass_at_k_ci95 {k: [low, high]}, pass_at_k_vs_control {k: {diff, low, high, sd, problems}}, n_problems``; ``control``, ``pass_at_k_pairs`` and ``bootstrap`` at the top |
| ``eval_samples.parquet`` | with ``save_completions=true``: one row per completion |

eval_problems.parquet columns: ``problem_id, condition, adapter, reference, greedy_correct,
greedy_status, greedy_extracted, greedy_flexible_correct, greedy_flexible_extracted, greedy_tokens``
(greedy pass) and ``n`` (scorable samples), ``n_correct, n_correct_flexible, n_error, extracted (list),
statuses (list), mean_tokens`` (sampled pass; n = 0 when n == 1).

pass@k policy: every k is averaged over ONE problem set, the problems with at least max(ks) scorable
samples, so pass@k never falls as k grows (engine/results/passk.py); the summary counts the problems left out.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from engine import io
from engine.backends import AdapterRef, Sampling, lora_int_id
from engine.commands.eval_config import resolve_conditions, resolve_control, validate
from engine.commands.eval_drift import reference_adapters, run_drift
from engine.config import ConfigError
from engine.evaluation.passes import PassResult, run_pass
from engine.lora.checks import adapter_rank, check_adapter_fits, check_adapter_weights
from engine.prompts import build_prompt
from engine.results.passk import pass_at_k_fixed_set
from engine.results.passk_compare import (CONFIDENCE, RESAMPLES, bootstrap_mean_interval, compare_conditions,
                                          pass_at_k_per_problem, problems_for_half_width)
from engine.tasks import Problem, load_task

log = logging.getLogger("essa.eval")

PLAN_HALF_WIDTH = 0.03  # pass@k units: an interval 6 points wide, F-GRPO's reported pass@256 gain (issue 44)
PLAN_MIN_PILOT = 10     # problems a comparison needs before its sd sizes a larger study


# --- conditions: resolve_conditions (engine/commands/eval_config.py, also checked by --cfg job) ---------

# PEFT LoraConfig fields (peft/tuners/lora/config.py) as essa eval's vLLM engine serves them
# (vLLM 0.32, vllm/lora/peft_helper.py and lora_model.py). Served: ``r`` with ``rank_pattern`` (the
# engine's max_lora_rank must cover the largest), ``lora_alpha`` with ``alpha_pattern`` and
# ``use_rslora`` (per-module scaling alpha / r or alpha / sqrt(r)), ``target_modules`` as a list or a
# regex string (vLLM takes the adapted modules from the weight names). Not served, so refused here
# with one line instead of failing inside the engine or being dropped: DoRA, ``modules_to_save``
# (whole trained modules), adapter biases.


def select_problems(cfg) -> list[Problem]:
    """The problems of ``cfg.split`` (first ``cfg.limit`` when > 0)."""
    task = load_task(cfg.task)
    if task.skipped:
        log.warning("task %s: skipped rows without a usable answer: %s", task.name, task.skipped)
    problems = task.val if cfg.split == "val" else task.train
    return problems[: cfg.limit] if cfg.limit else problems


# --- summary -----------------------------------------------------------------------------------

def sampled_counts(sampled: PassResult, a: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, c) of condition ``a`` of the sampled pass: scorable and correct samples per problem, int (N,) each."""
    n = sampled.scored[a].sum(axis=1)                                        # (N,)
    c = (sampled.correct[a] & sampled.scored[a]).sum(axis=1)                 # (N,)
    return n, c


def pass_at_k_fields(n: np.ndarray, c: np.ndarray, ks: Sequence[int], seed: int = 0) -> dict:
    """One condition's pass@k entries of eval_summary.json (keys ``str(k)``).

    ``pass_at_k``: mean pass@k over ONE problem set, those with at least max(ks) scorable samples
    (:func:`~engine.results.passk.pass_at_k_fixed_set`), so it never falls as k grows;
    ``pass_at_k_problems`` counts them, ``pass_at_k_excluded`` the others; ``pass_at_k_ci95``: ``[low,
    high]``, the percentile bootstrap interval over those problems of the mean (B = 2000 resamples with
    ``seed``; :func:`~engine.results.passk_compare.bootstrap_mean_interval`), None when the set is empty.
    """
    table, in_set = pass_at_k_fixed_set(n, c, ks)                            # one problem set for every k
    out = {"pass_at_k": {str(k): v for k, v in table.items()},
           "pass_at_k_problems": {str(k): int(in_set.sum()) for k in table},
           "pass_at_k_excluded": int((~in_set).sum()) if ks else 0,
           "pass_at_k_ci95": {str(k): None for k in table}}
    if ks and in_set.any():
        _, lo, hi = bootstrap_mean_interval(pass_at_k_per_problem(n[in_set], c[in_set], sorted(table)),
                                            RESAMPLES, seed, CONFIDENCE)
        out["pass_at_k_ci95"] = {str(k): [float(lo[j]) + 0.0, float(hi[j]) + 0.0] for j, k in enumerate(sorted(table))}
    return out


def summarise(greedy: PassResult, sampled: PassResult | None, ks: Sequence[int], names: Sequence[str],
              seed: int = 0) -> dict:
    """Per-condition metrics.

    greedy_accuracy: fraction of scorable problems solved greedily. avg_at_n: mean over problems of
    c / n. ``greedy_accuracy_flexible`` / ``avg_at_n_flexible``: the same under the flexible reward
    (None when it was not run; module docstring). pass_at_k, pass_at_k_problems, pass_at_k_excluded,
    pass_at_k_ci95: :func:`pass_at_k_fields` (``seed``: the bootstrap's).
    """
    out = {}
    for a, name in enumerate(names):
        g_ok = greedy.scored[a, :, 0]
        row = {"greedy_accuracy": float(greedy.correct[a, :, 0][g_ok].mean()) if g_ok.any() else None,
               "greedy_no_answer": float((greedy.status[a, :, 0] == "no_answer").mean()),
               "greedy_mean_tokens": float(greedy.n_tokens[a].mean()),
               "n_problems": int(greedy.correct.shape[1]), "n_scored_problems": int(g_ok.sum()),
               "avg_at_n": None, "pass_at_k": {}, "pass_at_k_problems": {}, "pass_at_k_ci95": {},
               "greedy_accuracy_flexible": None, "avg_at_n_flexible": None}
        if greedy.flexible_correct is not None and g_ok.any():
            row["greedy_accuracy_flexible"] = float(greedy.flexible_correct[a, :, 0][g_ok].mean())
        if sampled is not None:
            n, c = sampled_counts(sampled, a)                                    # (N,), (N,)
            has = n > 0
            row["avg_at_n"] = float((c[has] / n[has]).mean()) if has.any() else None
            if sampled.flexible_correct is not None and has.any():
                c_flex = (sampled.flexible_correct[a] & sampled.scored[a]).sum(axis=1)  # (N,)
                row["avg_at_n_flexible"] = float((c_flex[has] / n[has]).mean())
            row["sampled_mean_tokens"] = float(sampled.n_tokens[a].mean())
            row.update(pass_at_k_fields(n, c, ks, seed))
        out[name] = row
    return out


def compare_passk(sampled: PassResult, ks: Sequence[int], names: Sequence[str], control: str,
                  seed: int = 0) -> tuple[dict[str, dict], list[dict]]:
    """pass@k differences of the sampled pass: every condition against ``control``, and every pair of the
    others, each with its paired bootstrap 95 % interval over the problems both score
    (:func:`engine.results.passk_compare.compare_conditions`; B = 2000 resamples with ``seed``).

    Returns:
        ``(vs_control, pairs)``: ``{condition: {str(k): {"diff", "low", "high", "sd", "problems"}}}`` (condition
        minus control) and ``[{"condition", "against", "pass_at_k": {str(k): ...}}]``.
    """
    counts = {name: sampled_counts(sampled, a) for a, name in enumerate(names)}
    return compare_conditions(counts, ks, control, RESAMPLES, seed)


def format_table(summary: dict, n: int, ks: Sequence[int], title: str) -> str:
    """The printed results table (one line per condition; ``flexible``: greedy, flexible reward)."""
    flex = any(r.get("greedy_accuracy_flexible") is not None for r in summary.values())
    cols = ["greedy"] + (["flexible"] if flex else []) + ([f"avg@{n}"] + [f"pass@{k}" for k in ks] if ks else [])
    width = max([len("condition")] + [len(c) for c in summary]) + 2
    lines = [title, f"{'condition':<{width}}" + "".join(f"{c:>10}" for c in cols) + f"{'problems':>10}"]
    fmt = lambda v: f"{v + 0.0:>10.3f}" if v is not None else f"{'-':>10}"  # noqa: E731  (+ 0.0: no -0.000)
    for name, r in summary.items():
        vals = [r["greedy_accuracy"]] + ([r.get("greedy_accuracy_flexible")] if flex else []) \
            + ([r["avg_at_n"]] + [r["pass_at_k"][str(k)] for k in ks] if ks else [])
        lines.append(f"{name:<{width}}" + "".join(fmt(v) for v in vals) + f"{r['n_problems']:>10d}")
    if flex:
        lines.append("greedy, avg, pass: strict (answer marker required, the training reward); "
                     "flexible: greedy, marked answer or else the last number")
    return "\n".join(lines)


def format_diff_table(vs_control: dict[str, dict], pairs: list[dict], control: str, ks: Sequence[int]) -> str:
    """The printed block of pass@k differences: one line per k, one column per comparison (each condition
    minus ``control``, then each pair), ``diff [low, high]`` with the paired bootstrap 95 % interval. Each
    comparison is paired on its own problem set (the problems both conditions score, the same for every k),
    so its header counts them. The last line sizes a larger study (:func:`_plan_line`). Empty when there is
    nothing to compare."""
    cols = [(f"{name} - {control}", table) for name, table in vs_control.items()]
    cols += [(f"{p['condition']} - {p['against']}", p["pass_at_k"]) for p in pairs]
    if not cols or not ks:
        return ""
    plan = _plan_line(cols, max(ks))
    cols = [(f"{head} ({n} problem{'' if n == 1 else 's'})", table) for head, table in cols
            for n in [_problems(table)]]
    sign = lambda x: f"{round(x, 3) + 0.0:+.3f}"  # noqa: E731  (a -1e-17 prints +0.000, not -0.000)
    fmt = lambda d: ("-" if d is None or d["diff"] is None  # noqa: E731
                     else f"{sign(d['diff'])} [{sign(d['low'])}, {sign(d['high'])}]")
    width = max([26] + [len(h) + 2 for h, _ in cols])
    lines = [f"pass@k differences on the problems both conditions score (paired bootstrap over problems, "
             f"95 % interval; control: {control})",
             f"{'k':<8}" + "".join(f"{h:>{width}}" for h, _ in cols)]
    for k in ks:
        lines.append(f"{'pass@' + str(k):<8}" + "".join(f"{fmt(table.get(str(k))):>{width}}" for _, table in cols))
    return "\n".join(lines + ([plan] if plan else []))


def _plan_line(cols: list[tuple[str, dict]], k: int) -> str:
    """One line to size a larger study: for each comparison, the problems its pass@k difference at the
    largest k would need for a 95 % half-width of PLAN_HALF_WIDTH, from this call's per-problem sd
    (:func:`engine.results.passk_compare.problems_for_half_width`). A comparison paired on fewer than
    PLAN_MIN_PILOT problems, or whose conditions never differed there, shows ``-`` (no estimate). Empty
    when no comparison has one."""
    def need(table: dict) -> int | None:
        d = table.get(str(k)) or {}
        return problems_for_half_width(d.get("sd"), PLAN_HALF_WIDTH) if d.get("problems", 0) >= PLAN_MIN_PILOT else None

    shown = [(head, need(table)) for head, table in cols]
    if all(n is None for _, n in shown):
        return ""
    text = ", ".join(f"{head} {n if n is not None else '-'}" for head, n in shown)
    return (f"to size a larger study: problems for a 95 % half-width of {PLAN_HALF_WIDTH:g} at pass@{k}, from this "
            f"call's per-problem sd ('-': under {PLAN_MIN_PILOT} problems or no difference seen): {text}")


def _problems(table: dict) -> int:
    """The problems a comparison's table (``{str(k): {"diff", "low", "high", "sd", "problems"}}``) is paired on."""
    return next((d["problems"] for d in table.values() if isinstance(d, dict)), 0)


def _problem_rows(problems, names, conds, greedy: PassResult, sampled: PassResult | None) -> list[dict]:
    rows = []
    for a, name in enumerate(names):
        for i, p in enumerate(problems):
            row = {"problem_id": p.id, "condition": name, "adapter": None if conds[name] is None else str(conds[name]),
                   "reference": p.answer, "greedy_correct": bool(greedy.correct[a, i, 0]),
                   "greedy_status": greedy.status[a, i, 0], "greedy_extracted": greedy.extracted[a, i, 0],
                   "greedy_tokens": int(greedy.n_tokens[a, i, 0])}
            if greedy.flexible_correct is not None:
                row.update(greedy_flexible_correct=bool(greedy.flexible_correct[a, i, 0]),
                           greedy_flexible_extracted=greedy.flexible_extracted[a, i, 0])
            if sampled is not None:
                ok = sampled.scored[a, i]
                row.update(n=int(ok.sum()), n_correct=int((sampled.correct[a, i] & ok).sum()),
                           n_error=int((~ok).sum()), extracted=list(sampled.extracted[a, i]),
                           statuses=list(sampled.status[a, i]), mean_tokens=float(sampled.n_tokens[a, i].mean()))
                if sampled.flexible_correct is not None:
                    row.update(n_correct_flexible=int((sampled.flexible_correct[a, i] & ok).sum()))
            else:
                row.update(n=0, n_correct=0, n_error=0, extracted=[], statuses=[], mean_tokens=None)
            rows.append(row)
    return rows


def _sample_rows(problems, names, passes: dict[str, PassResult]) -> list[dict]:
    rows = []
    for kind, res in passes.items():
        A, N, G = res.status.shape
        for a in range(A):
            for i in range(N):
                for g in range(G):
                    rows.append({"problem_id": problems[i].id, "condition": names[a], "pass": kind, "sample": g,
                                 "completion": res.texts[a, i, g], "extracted_answer": res.extracted[a, i, g],
                                 "status": res.status[a, i, g], "n_tokens": int(res.n_tokens[a, i, g])})
    return rows


# --- the command -------------------------------------------------------------------------------

def build_backend(cfg, model_path: str, n_adapters: int, rank: int):
    """One local vLLM engine sized for ``n_adapters`` adapters of rank <= ``rank`` (LoRA off when 0)."""
    from engine.backends.vllm_local import VLLMBackend, backend_kwargs
    from engine.hardware import resolve_dtype

    return VLLMBackend(model_path, **backend_kwargs(
        cfg.engine, max_lora_rank=rank, max_loras=max(1, n_adapters), max_model_len=cfg.model.max_model_len,
        dtype=resolve_dtype(cfg.model.dtype)[0], seed=cfg.seed, enable_lora=n_adapters > 0))


def serving_rank(cfg, adapter_paths: list[Path]) -> int:
    """The engine's max_lora_rank: ``lora_rank``, else the largest rank among the adapters (whose configs
    are checked on the way, :func:`engine.lora.checks.adapter_rank`).

    Raises:
        ConfigError: ``lora_rank`` below an adapter's rank. ValueError: an adapter vLLM cannot serve.
    """
    needed = max([adapter_rank(p) for p in adapter_paths], default=8)
    if cfg.lora_rank and cfg.lora_rank < needed:
        raise ConfigError(f"lora_rank={cfg.lora_rank} is below the largest adapter rank {needed} (r or rank_pattern); "
                          f"set lora_rank=null or lora_rank>={needed}")
    return cfg.lora_rank or needed


def decode_passes(cfg, backend, problems, refs, reward_fn, flexible_fn) -> tuple[PassResult, PassResult | None]:
    """The greedy pass and, when ``n > 1``, the sampled pass (n samples per problem at ``temperature``)."""
    prompts = [build_prompt(backend.tokenizer, p.question, cfg.task.system_prompt) for p in problems]
    greedy = run_pass(backend, reward_fn, prompts, problems, refs,
                      Sampling(max_tokens=cfg.max_tokens, temperature=0.0, n=1, seed=cfg.seed), "greedy reward",
                      flexible_fn=flexible_fn)
    if cfg.n == 1:
        return greedy, None
    # common random numbers: the same seeds for a problem under every condition (module docstring)
    sampled = run_pass(backend, reward_fn, prompts, problems, refs,
                       Sampling(max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p, n=cfg.n,
                                seed=cfg.seed, common_seeds=True), "sampled reward", flexible_fn=flexible_fn)
    return greedy, sampled


def eval_summary(cfg, ks, conds, problems, greedy, sampled, model_path, wall: float, control: str) -> dict:
    """The eval_summary.json dict: settings, per-condition metrics (:func:`summarise`) with each one's pass@k
    difference against ``control`` (:func:`compare_passk`, n > 1), the pairs of the others, time and tokens."""
    tokens = int(greedy.n_tokens.sum() + (sampled.n_tokens.sum() if sampled is not None else 0))
    gen_s = greedy.generate_s + (sampled.generate_s if sampled is not None else 0.0)
    conditions = summarise(greedy, sampled, ks, list(conds), seed=cfg.seed)
    vs_control, pairs = compare_passk(sampled, ks, list(conds), control, cfg.seed) if sampled is not None else ({}, [])
    for name, table in vs_control.items():
        conditions[name]["pass_at_k_vs_control"] = table
    return {
        "label": cfg.label or f"{Path(str(cfg.model.path)).name} on {cfg.task.name}/{cfg.split}",
        "task": cfg.task.name, "split": cfg.split, "model": cfg.model.path, "model_path": model_path,
        "n_problems": len(problems), "n": cfg.n, "temperature": cfg.temperature if cfg.n > 1 else 0.0,
        "top_p": cfg.top_p, "ks": ks, "max_tokens": cfg.max_tokens, "seed": cfg.seed,
        "adapters": {k: (None if v is None else str(v)) for k, v in conds.items()},
        "control": control, "conditions": conditions, "pass_at_k_pairs": pairs, "wall_s": wall, "tokens": tokens,
        "tokens_per_s": tokens / max(gen_s, 1e-9),
        "estimator": "pass@k = 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, Eq. 1), mean over problems",
        "bootstrap": {"resamples": RESAMPLES, "confidence": CONFIDENCE, "seed": cfg.seed, "paired": True,
                      "over": "problems", "sampling_seeds": "common across conditions (seed + crc32(prompt))"},
    }


def write_outputs(cfg, out_dir: Path, summary: dict, conds, problems, greedy, sampled) -> None:
    """eval_problems.parquet, eval_samples.parquet (``save_completions``), eval_summary.json; the table."""
    names = list(conds)
    io.write_parquet(out_dir / "eval_problems.parquet", _problem_rows(problems, names, conds, greedy, sampled))
    if cfg.save_completions:
        passes = {"greedy": greedy, **({"sampled": sampled} if sampled is not None else {})}
        io.write_parquet(out_dir / "eval_samples.parquet", _sample_rows(problems, names, passes))
    io.write_json(out_dir / "eval_summary.json", summary)
    title = (f"\n{cfg.task.name}/{cfg.split}: {len(problems)} problems, greedy"
             + (f" + {cfg.n} samples at T={cfg.temperature}" if cfg.n > 1 else "")
             + f", {cfg.max_tokens} max tokens, {summary['wall_s']:.0f} s")
    print(format_table(summary["conditions"], cfg.n, summary["ks"], title))
    vs_control = {name: r["pass_at_k_vs_control"] for name, r in summary["conditions"].items()
                  if "pass_at_k_vs_control" in r}
    diffs = format_diff_table(vs_control, summary.get("pass_at_k_pairs", []), summary["control"], summary["ks"])
    if diffs:
        print(diffs)
    print(f"results: {out_dir / 'eval_summary.json'}, {out_dir / 'eval_problems.parquet'}")


def open_engine(cfg, adapter_paths: list[Path], rank: int):
    """The eval's local engine, sized for ``adapter_paths`` (checked before it starts), on the float model
    or its quantized copy, with the quantized base's self-check. Returns (backend, served model path)."""
    from engine.evaluation.selfcheck import check_served
    from engine.hardware import resolve_dtype
    from engine.model import resolve_model_path

    dtype = resolve_dtype(cfg.model.dtype, log_choice=False)[0]  # checked with the quantization (int4: not fp32)
    model_path = resolve_model_path(cfg.model.path, cfg.model.quantization, dtype)  # quantized copy when set
    for p in adapter_paths:  # vLLM would fail on these only after the engine started
        check_adapter_weights(p)
        check_adapter_fits(p, resolve_model_path(cfg.model.path))
    backend = build_backend(cfg, model_path, len(adapter_paths), rank)
    check_served(backend, cfg.model.quantization, model_path, rank)  # LoRA on a quantized base must apply
    return backend, model_path


def run_eval(cfg, out_dir: str | Path, backend=None, reward_fn=None, flexible_fn=None) -> dict:
    """Evaluate every condition on the split and write the outputs (module docstring).

    Args:
        cfg: composed :class:`engine.commands.eval_config.EvalConfig`.
        out_dir: output directory (created).
        backend: a ready back-end (tests); None = a local vLLM engine built from cfg and closed at the end.
        reward_fn: None = the task's reward from ``cfg.task`` and ``cfg.reward`` (the strict accuracy;
            engine/evaluation/build.py::task_reward).
        flexible_fn: None = the same with ``lenient=True`` (the flexible accuracy).

    Returns:
        The eval_summary.json dict.

    Raises:
        ConfigError / FileNotFoundError / ValueError: bad configuration or paths (one-line messages).
    """
    from engine.evaluation.build import task_reward

    ks = validate(cfg)
    if backend is None:
        from engine.backends import require_vllm
        require_vllm()
    conds = resolve_conditions(cfg.adapters, cfg.include_base)
    control = resolve_control(cfg.control, list(conds))
    problems = select_problems(cfg)
    if not problems:
        raise ValueError(f"split={cfg.split}: no problems to evaluate; check task and limit")
    adapter_paths = [p for p in conds.values() if p is not None]
    drift_refs = reference_adapters(cfg.drift.references, cfg.adapters) if cfg.drift.enabled else {}
    lora_paths = adapter_paths + [p for p in drift_refs.values() if p is not None and p not in adapter_paths]
    rank = serving_rank(cfg, lora_paths)
    refs = [None if p is None else AdapterRef(f"eval-{i}", lora_int_id(-1, i), str(p)) for i, p in enumerate(conds.values())]
    log.info("eval on %s/%s: %d problems x %d conditions (%s), greedy%s", cfg.task.name, cfg.split, len(problems),
             len(conds), ", ".join(conds), f" + {cfg.n} samples at T={cfg.temperature}" if cfg.n > 1 else " only")
    reward_fn = reward_fn or task_reward(cfg.task, cfg.reward)
    flexible_fn = flexible_fn or task_reward(cfg.task, cfg.reward, lenient=True, format_weight=0.0)
    t_start, model_path, own, drift = time.perf_counter(), None, backend is None, None
    if own:
        backend, model_path = open_engine(cfg, lora_paths, rank)
    try:
        greedy, sampled = decode_passes(cfg, backend, problems, refs, reward_fn, flexible_fn)
        if cfg.drift.enabled:
            drift = run_drift(cfg, backend, conds, drift_refs, backend.tokenizer, str(model_path), Path(out_dir))
    finally:
        if own:
            backend.close()
    summary = eval_summary(cfg, ks, conds, problems, greedy, sampled, model_path, time.perf_counter() - t_start,
                           control)
    if drift is not None:
        summary["drift"] = drift
    write_outputs(cfg, Path(out_dir), summary, conds, problems, greedy, sampled)
    return summary


def run(cfg, run_dir) -> None:
    """``essa eval``'s command function: outputs go to ``cfg.output_dir`` or Hydra's run dir."""
    run_eval(cfg, Path(cfg.output_dir) if cfg.output_dir else Path(run_dir))
