"""``essa eval``: greedy accuracy, avg@n and pass@k of a base model with and without PEFT adapters.

Conditions are the base model (``no_adapter``, unless ``include_base=false``) and every adapter
named in ``adapters`` (an adapter directory, or a run directory whose ``adapters/mean`` and
``adapters/best`` are taken). Each pass puts every (condition, problem) request into ONE multi-LoRA
vLLM batch (the same engine and reward as training, engine/backends/vllm_local.py, rewards/):

1. greedy (temperature 0, one completion per problem) -> greedy accuracy;
2. when ``n > 1``: n samples per problem at ``temperature`` -> avg@n (mean accuracy over the
   samples) and pass@k for every k in ``ks`` with the unbiased estimator of Chen et al. 2021
   (arXiv 2107.03374, Eq. 1; engine/passk.py). F-GRPO (arXiv 2602.06717) reports pass@256 this way.

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
| ``eval_summary.json`` | settings and, per condition, ``greedy_accuracy, greedy_accuracy_flexible, avg_at_n, avg_at_n_flexible, pass_at_k {k: value}, n_problems`` |
| ``eval_samples.parquet`` | with ``save_completions=true``: one row per completion |

eval_problems.parquet columns: ``problem_id, condition, adapter, reference, greedy_correct,
greedy_status, greedy_extracted, greedy_flexible_correct, greedy_flexible_extracted, greedy_tokens``
(greedy pass) and ``n`` (scorable samples), ``n_correct, n_correct_flexible, n_error, extracted (list),
statuses (list), mean_tokens`` (sampled pass; n = 0 when n == 1).

pass@k policy: every k is averaged over ONE problem set, the problems with at least max(ks) scorable
samples, so pass@k never falls as k grows (engine/passk.py); the summary counts the problems left out.
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional, Sequence

import numpy as np
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from . import io
from .backends import AdapterRef, Sampling, lora_int_id
from .config import ConfigError, EngineConfig, ModelConfig, RewardConfig, TaskConfig, check_sampling
from .passk import check_ks, default_ks, pass_at_k_fixed_set
from .prompts import build_prompt
from .tasks import Problem, load_task

log = logging.getLogger("essa.eval")

BASE = "no_adapter"


@dataclass
class EvalCommandConfig:
    """``essa eval`` (conf/eval.yaml).

    adapters: adapter directories and/or run directories (a run dir gives ``adapters/mean`` and
      ``adapters/best``); a single path, a list, or ``none``/``null``/``[]`` for the base model only.
    include_base: also evaluate the base model without an adapter (condition ``no_adapter``).
    split: ``val`` (the task's held-out rows, ``task.val_size`` of them) or ``train``.
    limit: at most this many problems of the split (0 = all).
    n: samples per problem at ``temperature`` (1 = greedy only; F-GRPO uses 256).
    temperature, top_p: decoding of the sampled pass (the greedy pass always uses temperature 0).
    ks: pass@k for these k, each in [1, n]; null = 1, 2, 4, ... up to n, plus n.
    max_tokens: new tokens per completion.
    seed: sampling seed (request i of a pass uses seed + i).
    lora_rank: the engine's max_lora_rank; null = the largest rank among the adapters (``r`` and
      ``rank_pattern`` of their adapter_config.json, :func:`adapter_rank`).
    output_dir: where results go; null = Hydra's run directory.
    save_completions: also write ``eval_samples.parquet`` (one row per completion; large for big n).
    label: name shown in reports; null = model and task.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    adapters: Any = field(default_factory=list)
    include_base: bool = True
    split: str = "val"
    limit: int = 0
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    ks: Optional[List[int]] = None
    max_tokens: int = 256
    seed: int = 0
    lora_rank: Optional[int] = None
    output_dir: Optional[str] = None
    save_completions: bool = False
    label: Optional[str] = None


# The adapters a run directory exports: essa train (mean genome, best candidate), essa grpo (final policy).
RUN_ADAPTERS = ("mean", "best", "final")


def register_eval_config() -> None:
    """Register ``eval_schema`` (the defaults-list head of conf/eval.yaml) with Hydra's ConfigStore."""
    ConfigStore.instance().store(name="eval_schema", node=EvalCommandConfig)


# --- conditions --------------------------------------------------------------------------------

def _adapter_specs(spec) -> list[str]:
    if spec is None:
        return []
    if OmegaConf.is_config(spec):
        spec = OmegaConf.to_container(spec, resolve=True)
    if isinstance(spec, (str, Path)):
        spec = [spec]
    out = [str(s).strip() for s in spec]
    return [s for s in out if s and s.lower() not in ("none", "null")]


def _is_adapter_dir(p: Path) -> bool:
    return (p / "adapter_config.json").is_file()


def resolve_conditions(spec, include_base: bool = True) -> dict[str, Path | None]:
    """Condition name -> adapter directory (None = base model), in evaluation order.

    Names: ``no_adapter`` for the base model; ``mean``/``best`` (essa train) or ``final`` (essa grpo)
    for a run directory's exports    (prefixed ``<run dir name>/`` when several sources are given); the directory name otherwise.

    Raises:
        FileNotFoundError: a path that is neither a PEFT adapter nor a run dir with adapters/.
        ConfigError: nothing to evaluate.
    """
    entries = _adapter_specs(spec)
    conds: dict[str, Path | None] = {BASE: None} if include_base else {}

    def add(name: str, path: Path) -> None:
        base, i = name, 2
        while name in conds:
            name, i = f"{base}-{i}", i + 1
        conds[name] = path

    for entry in entries:
        p = Path(entry).expanduser()
        if _is_adapter_dir(p):
            add(p.name, p.resolve())
        elif (p / "adapters").is_dir():
            found = [p / "adapters" / k for k in RUN_ADAPTERS if _is_adapter_dir(p / "adapters" / k)]
            if not found:
                raise FileNotFoundError(f"adapters: run dir {p} has no adapters/mean, adapters/best (essa train) "
                                        f"or adapters/final (essa grpo) "
                                        f"(did the run finish?); pass an adapter directory instead")
            for a in found:
                add(a.name if len(entries) == 1 else f"{p.name}/{a.name}", a.resolve())
        else:
            raise FileNotFoundError(f"adapters: {p} is neither a PEFT adapter (adapter_config.json) nor a run "
                                    f"directory with adapters/; check the path")
    if not conds:
        raise ConfigError("nothing to evaluate: adapters is empty and include_base=false; "
                          "name an adapter or set include_base=true")
    return conds


# PEFT LoraConfig fields (peft/tuners/lora/config.py) as essa eval's vLLM engine serves them
# (vLLM 0.32, vllm/lora/peft_helper.py and lora_model.py). Served: ``r`` with ``rank_pattern`` (the
# engine's max_lora_rank must cover the largest), ``lora_alpha`` with ``alpha_pattern`` and
# ``use_rslora`` (per-module scaling alpha / r or alpha / sqrt(r)), ``target_modules`` as a list or a
# regex string (vLLM takes the adapted modules from the weight names). Not served, so refused here
# with one line instead of failing inside the engine or being dropped: DoRA, ``modules_to_save``
# (whole trained modules), adapter biases.
_REFUSED = {
    "use_dora": ("DoRA (use_dora=true)", "merge it into the base model (peft merge_and_unload) and evaluate that "
                 "model, or train a plain LoRA"),
    "modules_to_save": ("fully trained modules (modules_to_save={value!r})", "merge the adapter into the base model "
                        "(peft merge_and_unload) and evaluate that model, or export it without modules_to_save"),
    "bias": ("trained biases (bias={value!r})", "merge the adapter into the base model (peft merge_and_unload), or "
             "train with bias=\"none\""),
    "lora_bias": ("LoRA biases (lora_bias=true)", "merge the adapter into the base model (peft merge_and_unload), or "
                  "train with lora_bias=false"),
}


def _bad_pattern(pattern, number: type | tuple) -> bool:
    """True unless ``pattern`` is None or a {module-name pattern: positive number} dict."""
    if pattern is None:
        return False
    return not isinstance(pattern, dict) or any(
        not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, number) or v <= 0 for k, v in pattern.items())


def adapter_rank(path: Path) -> int:
    """Largest LoRA rank an adapter uses: max(``r``, ``rank_pattern`` values) of its adapter_config.json.

    Also checks that essa eval's vLLM engine serves every PEFT feature the config turns on (the
    comment above ``_REFUSED``: ``rank_pattern``, ``alpha_pattern``, ``use_rslora`` and a regex
    ``target_modules`` work; DoRA, ``modules_to_save`` and biases are refused), so none is ignored.

    Raises:
        ValueError: one line naming the file, the field and the fix: invalid JSON, no positive
            integer ``r``, a malformed ``rank_pattern``/``alpha_pattern``/``target_modules``, or a
            feature vLLM does not serve.
    """
    f = Path(path) / "adapter_config.json"
    try:
        conf = io.read_json(f)
    except ValueError as e:
        raise ValueError(f"adapters: {e}; re-export the adapter or fix the file") from None
    r = conf.get("r") if isinstance(conf, dict) else None
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"adapters: {f} has no positive integer LoRA rank \"r\" (got {r!r}); re-export the adapter "
                         f"or add its rank, e.g. \"r\": 8")
    for name, number in (("rank_pattern", int), ("alpha_pattern", (int, float))):
        if _bad_pattern(conf.get(name), number):
            raise ValueError(f"adapters: {f} has {name}={conf.get(name)!r}; it must map module names to positive "
                             f"{'integer ranks' if number is int else 'alphas'}, e.g. {{\"q_proj\": 16}}; fix or "
                             f"re-export the adapter")
    for name, (what, fix) in _REFUSED.items():
        value = conf.get(name)
        if value not in (None, False, [], "none"):
            raise ValueError(f"adapters: {f} uses {what.format(value=value)}, which vLLM does not serve; {fix}")
    missing = [k for k in ("lora_alpha", "target_modules") if conf.get(k) in (None, "", [])]
    if missing:  # vLLM's PEFTHelper requires both; without this check the engine dies after start-up
        raise ValueError(f"adapters: {f} has no {' or '.join(missing)}; re-export the adapter with peft or add "
                         f"them, e.g. \"lora_alpha\": 16, \"target_modules\": [\"q_proj\", \"v_proj\"]")
    targets = conf.get("target_modules")
    if isinstance(targets, str):
        try:
            re.compile(targets)
        except re.error as e:
            raise ValueError(f"adapters: {f} has target_modules={targets!r}, not a valid regex ({e}); "
                             f"fix it or list the module names") from None
    return max([r, *(conf.get("rank_pattern") or {}).values()])


def check_adapter_weights(path: Path) -> None:
    """Checks an adapter's weights file before the engine starts, reading only the safetensors header.

    Raises:
        ValueError: one line naming the file (or tensor) and the fix: no ``adapter_model.safetensors``
            (or only a pickled ``adapter_model.bin``, which vLLM does not load here), an empty file, a
            file safetensors cannot open, or a ``lora_A``/``lora_B`` tensor whose rank disagrees with the config's ``r``
            (or its ``rank_pattern`` values).
    """
    path = Path(path)
    weights = path / "adapter_model.safetensors"
    if not weights.is_file():
        if (path / "adapter_model.bin").is_file():
            raise ValueError(f"adapters: {path} has only adapter_model.bin (pickle); convert it to safetensors, e.g. "
                             f"load it with peft and call save_pretrained(dir, safe_serialization=True)")
        raise ValueError(f"adapters: {path} has no adapter_model.safetensors (the LoRA weights); re-export the "
                         f"adapter with peft's save_pretrained or point adapters at a complete adapter directory")
    if weights.stat().st_size == 0:
        raise ValueError(f"adapters: {weights} is empty; re-export the adapter")
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="numpy") as f:
            shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - SafetensorError, OSError (permissions), header errors
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ValueError(f"adapters: {weights} is not a readable safetensors file ({why}); re-export the adapter "
                         f"or fix the file's permissions") from None
    conf = io.read_json(path / "adapter_config.json")
    ranks = {conf["r"], *(conf.get("rank_pattern") or {}).values()}
    for name, shape in shapes.items():
        if ".lora_A" in name and len(shape) == 2:
            rank = shape[0]
        elif ".lora_B" in name and len(shape) == 2:
            rank = shape[1]
        else:
            continue
        if rank not in ranks:
            want = f"r={conf['r']}" + (f" or a rank_pattern value {sorted(ranks - {conf['r']})}"
                                       if len(ranks) > 1 else "")
            raise ValueError(f"adapters: {weights} tensor {name} has shape {shape}, rank {rank}, but "
                             f"{path / 'adapter_config.json'} says {want}; re-export the adapter so config and "
                             f"weights agree")


# --- validation and data -----------------------------------------------------------------------

def validate_eval(cfg) -> list[int]:
    """Cross-field checks of an EvalCommandConfig; returns the pass@k list (empty when n == 1).

    Raises:
        ConfigError: one line naming the field and the fix.
    """
    if cfg.split not in ("val", "train"):
        raise ConfigError(f"split={cfg.split!r}: use val or train")
    if cfg.n < 1:
        raise ConfigError(f"n={cfg.n}: need at least one sample per problem (1 = greedy only)")
    check_sampling("", cfg.temperature, cfg.top_p)
    if cfg.n > 1 and cfg.temperature <= 0:
        raise ConfigError(f"temperature={cfg.temperature} with n={cfg.n} gives n identical samples; "
                          f"set temperature=1.0 or n=1")
    if cfg.limit < 0 or cfg.max_tokens < 1:
        raise ConfigError("limit must be >= 0 and max_tokens >= 1")
    if cfg.engine.backend != "local":
        raise ConfigError(f"engine.backend={cfg.engine.backend!r}: essa eval runs one local vLLM engine; "
                          f"use engine=local")
    if cfg.n == 1:
        if cfg.ks:
            raise ConfigError(f"ks={list(cfg.ks)} needs n >= max(ks) samples; set n (e.g. n={max(cfg.ks)})")
        return []
    try:
        return check_ks(list(cfg.ks), cfg.n) if cfg.ks else default_ks(cfg.n)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def select_problems(cfg) -> list[Problem]:
    """The problems of ``cfg.split`` (first ``cfg.limit`` when > 0)."""
    task = load_task(cfg.task)
    if task.skipped:
        log.warning("task %s: skipped rows without a usable answer: %s", task.name, task.skipped)
    problems = task.val if cfg.split == "val" else task.train
    return problems[: cfg.limit] if cfg.limit else problems


# --- one pass: generate for every (condition, problem) in one batch, score ---------------------

@dataclass
class PassResult:
    """One decoding pass over A conditions x N problems x G samples.

    Attributes:
        correct: (A, N, G) bool, status ``correct``.
        scored: (A, N, G) bool, status not ``error``.
        extracted: (A, N, G) object, extracted answer or None.
        status: (A, N, G) object, reward status.
        n_tokens: (A, N, G) int64, completion tokens.
        texts: (A, N, G) object, completion texts.
        generate_s: seconds in the back-end's generate call.
        flexible_correct: (A, N, G) bool, status ``correct`` under the flexible reward; None when
            no flexible reward was run.
        flexible_extracted: (A, N, G) object, the flexible reward's extracted answer, or None.
    """

    correct: np.ndarray
    scored: np.ndarray
    extracted: np.ndarray
    status: np.ndarray
    n_tokens: np.ndarray
    texts: np.ndarray
    generate_s: float
    flexible_correct: np.ndarray | None = None
    flexible_extracted: np.ndarray | None = None


def run_pass(backend, reward_fn, prompts: Sequence[str], problems: Sequence[Problem],
             adapters: Sequence[AdapterRef | None], sampling: Sampling, desc: str = "reward",
             chunk: int = 512, flexible_fn=None) -> PassResult:
    """Generate for all A x N (condition, problem) requests in ONE back-end call and score them.

    Args:
        backend: ``generate(prompts, adapters, sampling, use_tqdm) -> list[list[Completion]]``.
        reward_fn: ``f(completions, references) -> list[RewardResult]`` (rewards.MathReward).
        prompts: N chat-templated prompts, aligned with ``problems``.
        adapters: A adapter refs (None = base model).
        sampling: decoding; G = sampling.n samples per request.
        chunk: completions per reward call (one progress-bar step).
        flexible_fn: the flexible reward, same signature as ``reward_fn``; None = none.
    """
    from tqdm.auto import tqdm

    A, N, G = len(adapters), len(problems), sampling.n
    flat_prompts = [p for _ in range(A) for p in prompts]                 # (A*N,) adapter-major
    flat_adapters = [a for a in adapters for _ in range(N)]
    t0 = time.perf_counter()
    outs = backend.generate(flat_prompts, flat_adapters, sampling, use_tqdm=True)
    generate_s = time.perf_counter() - t0
    if len(outs) != A * N or any(len(o) != G for o in outs):
        raise RuntimeError(f"back-end returned {len(outs)} requests for {A * N}, expected {G} completions each")
    texts = [c.text for o in outs for c in o]                             # (A*N*G,)
    refs = [problems[(i // G) % N].answer for i in range(len(texts))]
    results, flexible = [], []
    for s in tqdm(range(0, len(texts), chunk), desc=desc, unit="chunk", leave=False):
        results.extend(reward_fn(texts[s:s + chunk], refs[s:s + chunk]))
        if flexible_fn is not None:
            flexible.extend(flexible_fn(texts[s:s + chunk], refs[s:s + chunk]))
    status = np.array([r.status for r in results], dtype=object).reshape(A, N, G)

    def objects(values) -> np.ndarray:                                    # (A, N, G) object
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        return arr.reshape(A, N, G)

    flex_correct = flex_extracted = None
    if flexible_fn is not None:
        flex_correct = np.array([r.status == "correct" for r in flexible], dtype=bool).reshape(A, N, G)
        flex_extracted = objects([r.extracted for r in flexible])
    n_tokens = np.array([c.n_tokens for o in outs for c in o]).reshape(A, N, G)
    return PassResult(correct=status == "correct", scored=status != "error",
                      extracted=objects([r.extracted for r in results]), status=status, n_tokens=n_tokens,
                      texts=objects(texts), generate_s=generate_s, flexible_correct=flex_correct,
                      flexible_extracted=flex_extracted)


# --- summary -----------------------------------------------------------------------------------

def summarise(greedy: PassResult, sampled: PassResult | None, ks: Sequence[int], names: Sequence[str]) -> dict:
    """Per-condition metrics.

    greedy_accuracy: fraction of scorable problems solved greedily. avg_at_n: mean over problems of
    c / n. ``greedy_accuracy_flexible`` / ``avg_at_n_flexible``: the same under the flexible reward
    (None when it was not run; module docstring). pass_at_k: ``{k: mean pass@k}``, every k over the
    same problems: those with at least max(ks) scorable samples (engine/passk.py,
    :func:`~engine.passk.pass_at_k_fixed_set`), so it never falls as k grows; ``pass_at_k_problems``
    counts them, ``pass_at_k_excluded`` the others.
    """
    out = {}
    for a, name in enumerate(names):
        g_ok = greedy.scored[a, :, 0]
        row = {"greedy_accuracy": float(greedy.correct[a, :, 0][g_ok].mean()) if g_ok.any() else None,
               "greedy_no_answer": float((greedy.status[a, :, 0] == "no_answer").mean()),
               "greedy_mean_tokens": float(greedy.n_tokens[a].mean()),
               "n_problems": int(greedy.correct.shape[1]), "n_scored_problems": int(g_ok.sum()),
               "avg_at_n": None, "pass_at_k": {}, "pass_at_k_problems": {},
               "greedy_accuracy_flexible": None, "avg_at_n_flexible": None}
        if greedy.flexible_correct is not None and g_ok.any():
            row["greedy_accuracy_flexible"] = float(greedy.flexible_correct[a, :, 0][g_ok].mean())
        if sampled is not None:
            n = sampled.scored[a].sum(axis=1)                                    # (N,)
            c = (sampled.correct[a] & sampled.scored[a]).sum(axis=1)             # (N,)
            has = n > 0
            row["avg_at_n"] = float((c[has] / n[has]).mean()) if has.any() else None
            if sampled.flexible_correct is not None and has.any():
                c_flex = (sampled.flexible_correct[a] & sampled.scored[a]).sum(axis=1)  # (N,)
                row["avg_at_n_flexible"] = float((c_flex[has] / n[has]).mean())
            row["sampled_mean_tokens"] = float(sampled.n_tokens[a].mean())
            table, in_set = pass_at_k_fixed_set(n, c, ks)                     # one problem set for every k
            row["pass_at_k"] = {str(k): v for k, v in table.items()}
            row["pass_at_k_problems"] = {str(k): int(in_set.sum()) for k in table}
            row["pass_at_k_excluded"] = int((~in_set).sum()) if ks else 0
        out[name] = row
    return out


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
    from .backends.vllm_local import VLLMBackend
    from .hardware import resolve_dtype

    e = cfg.engine
    extra = OmegaConf.to_container(e.extra, resolve=True) or {}
    return VLLMBackend(model_path, max_lora_rank=rank, max_loras=e.max_loras or max(1, n_adapters),
                       max_model_len=cfg.model.max_model_len, dtype=resolve_dtype(cfg.model.dtype)[0], seed=cfg.seed,
                       gpu_memory_utilization=e.gpu_memory_utilization, kv_cache_gib=e.kv_cache_gib,
                       enforce_eager=e.enforce_eager, enable_lora=n_adapters > 0, max_num_seqs=e.max_num_seqs,
                       fast_lora=e.fast_lora, extra=extra)


def run_eval(cfg, out_dir: str | Path, backend=None, reward_fn=None, flexible_fn=None) -> dict:
    """Evaluate every condition on the split and write the outputs (module docstring).

    Args:
        cfg: composed EvalCommandConfig.
        out_dir: output directory (created).
        backend: a ready back-end (tests); None = a local vLLM engine built from cfg and closed at the end.
        reward_fn: None = ``rewards.MathReward`` from ``cfg.reward`` (the strict accuracy).
        flexible_fn: None = the same with ``lenient=True`` (the flexible accuracy).

    Returns:
        The eval_summary.json dict.

    Raises:
        ConfigError / FileNotFoundError / ValueError: bad configuration or paths (one-line messages).
    """
    ks = validate_eval(cfg)
    out_dir = Path(out_dir)
    conds = resolve_conditions(cfg.adapters, cfg.include_base)
    names = list(conds)
    problems = select_problems(cfg)
    if not problems:
        raise ValueError(f"split={cfg.split}: no problems to evaluate; check task and limit")
    adapter_paths = [p for p in conds.values() if p is not None]
    needed = max([adapter_rank(p) for p in adapter_paths], default=8)       # checks every adapter's config
    if cfg.lora_rank and cfg.lora_rank < needed:
        raise ConfigError(f"lora_rank={cfg.lora_rank} is below the largest adapter rank {needed} (r or rank_pattern); "
                          f"set lora_rank=null or lora_rank>={needed}")
    rank = cfg.lora_rank or needed
    refs = [None if p is None else AdapterRef(f"eval-{i}", lora_int_id(-1, i), str(p))
            for i, p in enumerate(conds.values())]
    log.info("eval on %s/%s: %d problems x %d conditions (%s), greedy%s", cfg.task.name, cfg.split, len(problems),
             len(names), ", ".join(names), f" + {cfg.n} samples at T={cfg.temperature}" if cfg.n > 1 else " only")
    from rewards import MathReward
    if reward_fn is None:
        reward_fn = MathReward(lenient=cfg.reward.lenient, timeout_s=cfg.reward.timeout_s,
                               format_weight=cfg.reward.format_weight)
    if flexible_fn is None:
        flexible_fn = MathReward(lenient=True, timeout_s=cfg.reward.timeout_s)
    t_start = time.perf_counter()
    model_path = None
    own = backend is None
    if own:
        for p in adapter_paths:  # vLLM would fail on these only after the engine started
            check_adapter_weights(p)
        from .model import resolve_model_path
        model_path = resolve_model_path(cfg.model.path, cfg.model.quantization)  # quantized copy when set
        backend = build_backend(cfg, model_path, len(adapter_paths), rank)
    try:
        prompts = [build_prompt(backend.tokenizer, p.question, cfg.task.system_prompt) for p in problems]
        greedy = run_pass(backend, reward_fn, prompts, problems, refs,
                          Sampling(max_tokens=cfg.max_tokens, temperature=0.0, n=1, seed=cfg.seed), "greedy reward",
                          flexible_fn=flexible_fn)
        sampled = None
        if cfg.n > 1:
            sampled = run_pass(backend, reward_fn, prompts, problems, refs,
                               Sampling(max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                                        n=cfg.n, seed=cfg.seed), "sampled reward", flexible_fn=flexible_fn)
    finally:
        if own:
            backend.close()
    wall = time.perf_counter() - t_start
    per_cond = summarise(greedy, sampled, ks, names)
    tokens = int(greedy.n_tokens.sum() + (sampled.n_tokens.sum() if sampled is not None else 0))
    gen_s = greedy.generate_s + (sampled.generate_s if sampled is not None else 0.0)
    summary = {
        "label": cfg.label or f"{Path(str(cfg.model.path)).name} on {cfg.task.name}/{cfg.split}",
        "task": cfg.task.name, "split": cfg.split, "model": cfg.model.path, "model_path": model_path,
        "n_problems": len(problems), "n": cfg.n, "temperature": cfg.temperature if cfg.n > 1 else 0.0,
        "top_p": cfg.top_p, "ks": ks, "max_tokens": cfg.max_tokens, "seed": cfg.seed,
        "adapters": {k: (None if v is None else str(v)) for k, v in conds.items()},
        "conditions": per_cond, "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / max(gen_s, 1e-9),
        "estimator": "pass@k = 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, Eq. 1), mean over problems",
    }
    io.write_parquet(out_dir / "eval_problems.parquet", _problem_rows(problems, names, conds, greedy, sampled))
    if cfg.save_completions:
        passes = {"greedy": greedy, **({"sampled": sampled} if sampled is not None else {})}
        io.write_parquet(out_dir / "eval_samples.parquet", _sample_rows(problems, names, passes))
    io.write_json(out_dir / "eval_summary.json", summary)
    title = (f"\n{cfg.task.name}/{cfg.split}: {len(problems)} problems, greedy"
             + (f" + {cfg.n} samples at T={cfg.temperature}" if cfg.n > 1 else "")
             + f", {cfg.max_tokens} max tokens, {wall:.0f} s")
    print(format_table(per_cond, cfg.n, ks, title))
    print(f"results: {out_dir / 'eval_summary.json'}, {out_dir / 'eval_problems.parquet'}")
    return summary


def main(cfg, run_dir: str | Path) -> dict:
    """Entry point of ``essa eval`` (engine/cli.py): outputs go to ``cfg.output_dir`` or Hydra's run dir."""
    return run_eval(cfg, Path(cfg.output_dir) if cfg.output_dir else Path(run_dir))
