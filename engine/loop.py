"""The ESSA run loop: warm start, then ask -> evaluate -> tell, with logs, checkpoints and exports.

ESSA (arXiv 2507.04453) Algorithm 1:
  1. SFT warm start of a LoRA adapter (engine/sft.py);
  2. SVD of each LoRA factor; the genome is the offsets of the top singular values (strategies/genomes.py);
  3. each generation: the strategy asks for P candidates, all are evaluated on one fresh minibatch of N
     prompts in one multi-LoRA vLLM batch (engine/population.py), fitness = mean reward, tell.

Everything random derives from (seed, generation) or lives in the strategy state, so a resumed run
replays nothing and skips nothing (STYLE.md rule 11).
"""
from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from . import interrupts, io
from .adapters import read_adapter, write_adapter
from .backends import AdapterRef, Sampling, lora_int_id, sft_adapter_ref
from .config import ConfigError, hydra_overrides, run_label, validate
from .hardware import dtype_record, resolve_dtype
from .model import resolve_model_path, serving_model_path
from .plugins import strategy_class
from .population import AdapterMeta, PopulationEvaluator, question_z_fitness
from .sft import warm_start
from .stats import VALIDATION_PROBLEMS
from .tasks import Problem, Task, load_task

log = logging.getLogger("essa")

CHECKPOINT = "checkpoint.pkl"
CHECKPOINT_VERSION = 1
# Fields whose change makes a checkpoint meaningless for the resumed run.
RESUME_KEYS = ("model", "task", "lora", "sft", "strategy", "rollout", "seed")


def minibatch(train: list[Problem], n: int, seed: int, generation: int) -> list[Problem]:
    """The generation's minibatch: N distinct problems drawn from a stream seeded by (seed, generation).

    ESSA §3.3: every candidate of a generation sees the same prompts; a fresh batch each generation.
    """
    rng = np.random.default_rng([seed, generation])
    idx = rng.choice(len(train), size=min(n, len(train)), replace=False)
    return [train[i] for i in idx]


def generation_sampling(cfg, generation: int) -> Sampling:
    """Decoding settings of a generation's rollouts, one for all its candidates and the centre: with
    ``rollout.common_seeds`` they sample each prompt with the same seeds (a paired comparison); the
    base seed derives from (seed, generation), so a resumed run draws what an uninterrupted one does."""
    r = cfg.rollout
    return Sampling(max_tokens=r.max_tokens, temperature=r.temperature, top_p=r.top_p, n=r.samples_per_prompt,
                    seed=cfg.seed * 1_000_003 + generation * 10_007, common_seeds=r.common_seeds)


def resume_config(cfg) -> dict:
    """The config fields a checkpoint depends on (RESUME_KEYS), resolved to plain Python values
    (those ``cfg`` has: an old run's saved .hydra/config.yaml may lack some)."""
    return {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
            for k in RESUME_KEYS if k in cfg}


def config_key(cfg) -> str:
    """Hash of the config fields a checkpoint depends on (RESUME_KEYS)."""
    return hashlib.sha256(json.dumps(resume_config(cfg), sort_keys=True, default=str).encode()).hexdigest()[:16]


_UNSET = object()


def config_diff(old: dict, new: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """Dotted fields whose values differ between two plain config dicts, as ``(field, old, new)``.

    A field present on one side only has ``_UNSET`` on the other. Lists compare whole.
    """
    out = []
    for k in sorted(set(old) | set(new), key=str):
        a, b, name = old.get(k, _UNSET), new.get(k, _UNSET), f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_diff(a, b, f"{name}.")
        elif json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            out.append((name, a, b))
    return out


def _added_with_default(field: str, value) -> bool:
    """Whether ``field`` (dotted) has ``value`` as its schema default (engine/config.py TrainConfig):
    a field a newer version added, at the value that reproduces the older version's behaviour."""
    from .config import TrainConfig
    try:
        default = OmegaConf.select(OmegaConf.structured(TrainConfig), field, throw_on_missing=True)
    except Exception:  # noqa: BLE001 - not in the schema (a plugin's field) or missing: no default
        return False
    default = OmegaConf.to_container(default, resolve=True) if OmegaConf.is_config(default) else default
    return default is not None and json.dumps(default, sort_keys=True) == json.dumps(value, sort_keys=True, default=str)


def _resume_mismatch(ckpt: dict, cfg, run_dir: Path) -> str | None:
    """None when ``cfg`` may resume the checkpoint (its RESUME_KEYS fields are the checkpointed run's,
    fields added since by a newer version at their defaults aside), else one line naming the
    differing fields and the fix."""
    if ckpt.get("config_key") == config_key(cfg):
        return None
    old = ckpt.get("config")
    if not isinstance(old, dict):  # checkpoints written before the config was stored: Hydra's copy
        try:
            old = resume_config(OmegaConf.load(run_dir / ".hydra" / "config.yaml"))
        except Exception:  # noqa: BLE001 - no or unreadable copy: fall back to the generic message
            old = None
    diff = config_diff(old, resume_config(cfg)) if old else []
    if diff and all(a is _UNSET and _added_with_default(k, b) for k, a, b in diff):
        return None
    if not diff:
        return (f"resume: the config differs from the checkpointed run in one of {RESUME_KEYS}; "
                f"resume with the same overrides as {run_dir}/.hydra/overrides.yaml")

    def show(v):
        return "<unset>" if v is _UNSET else json.dumps(v, default=str)

    shown = "; ".join(f"{k}: {show(a)} in the checkpoint, {show(b)} now" for k, a, b in diff[:5])
    more = f"; and {len(diff) - 5} more" if len(diff) > 5 else ""
    fix = " ".join(f"{k}={show(a)}" if a is not _UNSET else f"{k} at its default" for k, a, _ in diff[:5])
    return (f"resume: the config differs from the checkpointed run in {len(diff)} field(s) ({shown}{more}); "
            f"resume with the checkpoint's values{f' ({fix})' if fix else ''} or start a new run without resume")


@dataclass
class RunState:
    """What a checkpoint restores: last finished generation, strategy state, best candidate, clock."""

    generation: int = -1
    wall_s: float = 0.0
    best_fitness: float = -np.inf
    best_genome: np.ndarray | None = None
    best_generation: int = -1


def check_strategy_options(strategy_cls, cfg) -> None:
    """Build the strategy once on a 2-dimensional problem so bad ``strategy.options`` fail before
    the SFT warm start (the real strategy needs the genome's dimension, known only after it).

    Raises:
        ConfigError: the class rejects the options (one line naming ``strategy.options``).
    """
    options = OmegaConf.to_container(cfg.strategy.options, resolve=True)
    try:
        strategy_cls(dim=2, x0=None, seed=cfg.seed, population_size=cfg.strategy.population_size,
                     sigma0=cfg.strategy.sigma0, **options)
    except (TypeError, ValueError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"strategy.options={options}: {strategy_cls.__name__} rejects them ({msg})") from None


def build_evaluator(cfg, model_path: str, codec, meta: AdapterMeta, tokenizer):
    """The population evaluator of ``engine.backend``: local vLLM or Ray actors."""
    from rewards import MathReward

    reward_fn = MathReward(lenient=cfg.reward.lenient, timeout_s=cfg.reward.timeout_s,
                           format_weight=cfg.reward.format_weight)
    if cfg.engine.backend == "ray":
        from .backends.ray_backend import RayPopulationEvaluator
        return RayPopulationEvaluator(cfg, model_path, codec, meta, reward_fn)
    from .backends.vllm_local import VLLMBackend
    backend = VLLMBackend(
        model_path, max_lora_rank=cfg.lora.rank,
        max_loras=cfg.engine.max_loras or cfg.strategy.population_size + 2,
        max_model_len=cfg.model.max_model_len, dtype=cfg.model.dtype, seed=cfg.seed,
        gpu_memory_utilization=cfg.engine.gpu_memory_utilization, kv_cache_gib=cfg.engine.kv_cache_gib,
        enforce_eager=cfg.engine.enforce_eager, max_num_seqs=cfg.engine.max_num_seqs,
        fast_lora=cfg.engine.fast_lora, extra=OmegaConf.to_container(cfg.engine.extra))
    return PopulationEvaluator(backend, codec, reward_fn, meta, tokenizer, cfg.task.system_prompt,
                               cfg.engine.adapter_dir)


def validation(evaluator, conditions: dict[str, AdapterRef | None], val: list[Problem], cfg) -> dict[str, np.ndarray]:
    """Greedy held-out rewards of each condition (adapter or None = base model), in one batch.

    Returns:
        ``{condition: (n,) float64}`` reward per held-out problem, in ``val`` order (NaN = could not
        be scored; accuracy counts it as wrong). Per-problem results let two conditions be compared
        on the same problems (engine/stats.py).
    """
    sampling = Sampling(max_tokens=cfg.eval.max_tokens, temperature=0.0, n=1, seed=cfg.seed)
    names = list(conditions)
    rewards, *_ = evaluator.score([conditions[k] for k in names], val, sampling)
    return {k: rewards[i].reshape(len(val), -1).mean(axis=1) for i, k in enumerate(names)}


def generation_row(g: int, wall_s: float, result, P: int, sigma: float, t_ask: float, t_tell: float) -> dict:
    """One metrics.parquet row: fitness of the P candidates, the centre (index P, when evaluated),
    the signal diagnostics of engine/stats.py, tokens and seconds per phase."""
    from .stats import prompts_disagreeing, split_half_rank_correlation, variance_ratio

    fit, rewards = result.fitness[:P], result.rewards[:P]
    ok = np.isfinite(fit).any()
    tm = result.timings
    row = {"generation": g, "wall_s": wall_s,
           "fitness_mean": float(np.nanmean(fit)) if ok else float("nan"),
           "fitness_max": float(np.nanmax(fit)) if ok else float("nan"),
           "fitness_min": float(np.nanmin(fit)) if ok else float("nan"),
           "fitness_std": float(np.nanstd(fit)) if ok else float("nan"),
           "fitness_center": float(result.fitness[P]) if len(result.fitness) > P else float("nan"),
           "split_half_rho": split_half_rank_correlation(rewards), "variance_ratio": variance_ratio(rewards),
           "prompts_disagreeing": prompts_disagreeing(rewards),
           "n_failed": int((~np.isfinite(fit)).sum()), "sigma": float(sigma),
           "tokens": result.tokens, "tokens_per_s": result.tokens / max(tm.get("generate", 0.0), 1e-9),
           "t_ask": t_ask, "t_decode": tm.get("decode", 0.0), "t_write": tm.get("write", 0.0),
           "t_generate": tm.get("generate", 0.0), "t_reward": tm.get("reward", 0.0), "t_tell": t_tell}
    row.update({f"t_{k}": v for k, v in tm.items() if f"t_{k}" not in row})
    return row


def _truncate_logs(run_dir: Path, generation: int) -> None:
    """Drop log rows written after the checkpointed generation (a crash between log and checkpoint)."""
    rows = [r for r in io.read_rows(run_dir / "metrics.parquet") if r["generation"] <= generation]
    if rows:
        io.write_parquet(run_dir / "metrics.parquet", rows)
    vrows = [r for r in io.read_rows(run_dir / "validation.parquet") if r["step"] <= generation + 1]
    if vrows:
        io.write_parquet(run_dir / "validation.parquet", vrows)
    prows = [r for r in io.read_rows(run_dir / VALIDATION_PROBLEMS) if r["step"] <= generation + 1]
    if prows:
        io.write_parquet(run_dir / VALIDATION_PROBLEMS, prows)
    for f in (run_dir / "rollouts").glob("gen_*.parquet"):
        if int(f.stem.split("_")[1]) > generation:
            f.unlink()


def periodic_validation_due(g: int, cfg, wall_s: float) -> bool:
    """Whether the held-out validation of the mean genome runs after generation ``g`` (at step g + 1).

    Every ``eval.every`` generations, except after the last one and after a generation that ended
    past ``time_budget_s`` (``wall_s`` seconds into the run): the final validation covers those.
    """
    over = cfg.time_budget_s is not None and wall_s >= cfg.time_budget_s
    last = g == cfg.generations - 1 or over
    return bool(not last and cfg.eval.every and (g + 1) % cfg.eval.every == 0)


def deadline_allows(cfg, g: int, elapsed_s: float, generation_s: float, tokens_per_completion: float,
                    tokens_per_s: float, n_val: int) -> bool:
    """Whether generation ``g`` may run under ``cfg.deadline_s``, decided right after generation
    ``g - 1`` ended, ``elapsed_s`` seconds after the command started.

    The projection: this invocation's slowest generation so far (``generation_s``), plus the
    held-out validations still to come: the periodic ones due after ``g - 1`` (not run yet: it is
    skipped when the run stops, the final call covers it) and after ``g`` (the mean genome), and the
    final call (the SFT warm start when ``eval.baselines``, the mean and the best genome). A
    validation condition is priced from the last generation: ``n_val`` problems x
    ``tokens_per_completion`` (capped at ``eval.max_tokens``) / ``tokens_per_s``. Why: ``make run``
    must end within its wall-clock limit on a slow CPU too (issue 10: fp32 on AVX2 generates ~160
    tok/s against ~650 with native bf16), and the final table is what the user waits for.
    """
    if cfg.deadline_s is None:
        return True
    periodic = int(g > 0 and periodic_validation_due(g - 1, cfg, 0.0)) + int(periodic_validation_due(g, cfg, 0.0))
    conditions = int(bool(cfg.eval.baselines)) + 2 + periodic
    val_s = conditions * n_val * min(tokens_per_completion, cfg.eval.max_tokens) / max(tokens_per_s, 1e-9)
    return elapsed_s + generation_s + val_s <= cfg.deadline_s


@dataclass
class _Progress:
    """What an interrupted run reports: its directory, the generation of the checkpoint on disk
    (-1: none yet) and the evaluator to close."""

    run_dir: Path | None = None
    checkpoint_generation: int = -1
    evaluator: object = None


def run_train(cfg, run_dir: str | Path) -> dict:
    """Run (or resume) one ESSA training job; returns the final accuracy table.

    Args:
        cfg: composed ``engine.config.TrainConfig``.
        run_dir: Hydra's run directory (ignored when ``cfg.resume`` names another run dir).

    Returns:
        ``{"val": {condition: accuracy}, "n_problems": int, "run_dir": str}``.

    Raises:
        ConfigError / ValueError / FileNotFoundError: bad configuration or input (one-line messages).
        KeyboardInterrupt: Ctrl-C (SIGINT), also when another exception follows it (vLLM's
            ``EngineDeadError`` once the signal reached the engine's own process,
            :mod:`engine.interrupts`). The checkpoint of the last finished generation, written
            right after it, is left as it is (the strategy may already have asked for the next
            generation); one line on stderr says how to resume, or that nothing can be resumed.
    """
    progress = _Progress()
    try:
        return _run_train(cfg, run_dir, progress)
    except BaseException as exc:
        if not isinstance(exc, KeyboardInterrupt) and not interrupts.requested():
            raise
        _report_interrupt(progress, exc)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise KeyboardInterrupt(f"interrupted ({type(exc).__name__} after Ctrl-C)") from exc


def _report_interrupt(progress: _Progress, exc: BaseException) -> None:
    """Close the evaluator and its engine, then print the interrupted run's one line on stderr (resume
    hint, or nothing to resume): last, after whatever vLLM's engine processes print as they stop."""
    ev = progress.evaluator
    if ev is not None:
        for close in (getattr(getattr(ev, "backend", None), "close", None), ev.close):
            if close is None:
                continue
            try:
                close()
            except BaseException as e:  # noqa: BLE001 - a dead engine, or a second Ctrl-C: we are exiting anyway
                log.warning("closing the evaluator after the interrupt failed: %s: %s", type(e).__name__, e)
    after = "" if isinstance(exc, KeyboardInterrupt) else f" ({type(exc).__name__} after Ctrl-C)"
    if progress.run_dir is None:
        print(f"\ninterrupted{after} before the run started", file=sys.stderr)
    elif progress.checkpoint_generation >= 0:
        print(f"\ninterrupted{after}: checkpoint of generation {progress.checkpoint_generation} in "
              f"{progress.run_dir / CHECKPOINT}; continue with: essa train resume={progress.run_dir} "
              "<same overrides>", file=sys.stderr)
    else:
        print(f"\ninterrupted{after} before the first generation finished: nothing to resume (no checkpoint in "
              f"{progress.run_dir}); start the run again (a finished SFT warm start is cached)", file=sys.stderr)


def _run_train(cfg, run_dir: str | Path, progress: _Progress) -> dict:
    """:func:`run_train`'s body; records in ``progress`` what an interrupt message needs."""
    from strategies.genomes import make_genome

    t_command = time.perf_counter()  # deadline_s counts from here, the warm start included
    validate(cfg)
    run_dir = Path(cfg.resume) if cfg.resume else Path(run_dir)
    progress.run_dir = run_dir
    state = RunState()
    ckpt = None
    if cfg.resume:
        ckpt = io.read_pickle(run_dir / CHECKPOINT)
        if not isinstance(ckpt, dict) or ckpt.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"resume: {run_dir / CHECKPOINT} is not an essa checkpoint (version "
                             f"{ckpt.get('version') if isinstance(ckpt, dict) else '?'}); start afresh without resume")
        mismatch = _resume_mismatch(ckpt, cfg, run_dir)
        if mismatch:
            raise ValueError(mismatch)
        state = ckpt.get("run_state")
        if not isinstance(state, RunState) or not isinstance(ckpt.get("strategy"), dict):
            raise ValueError(f"resume: {run_dir / CHECKPOINT} is incomplete (no run state or strategy state); "
                             "start afresh without resume")
        done = state.generation + 1
        if cfg.generations <= done and (run_dir / "summary.json").exists():
            # a finished run: resuming would only repeat the final validation and append duplicate rows
            raise ValueError(f"resume: {run_dir} already finished all {done} generations; raise "
                             f"generations={2 * done} (any value > {done}) to continue, or start a new run")
    progress.checkpoint_generation = state.generation  # -1 in a new run
    run_dir.mkdir(parents=True, exist_ok=True)

    strategy_cls = strategy_class(cfg.strategy)  # fail fast, before SFT
    check_strategy_options(strategy_cls, cfg)
    model_path = resolve_model_path(cfg.model.path)
    dtype, dtype_reason = resolve_dtype(cfg.model.dtype)  # vLLM's; logs one line
    sft_dtype, _ = resolve_dtype(cfg.model.dtype, purpose="training", log_choice=False)
    # vLLM serves the population on this checkpoint: the float model, or its quantized copy
    # (model.quantization, built once and checked before the SFT warm start); SFT and adapters stay float
    serve_path = serving_model_path(model_path, cfg.model.quantization)
    task: Task = load_task(cfg.task)
    if task.skipped:
        log.warning("task %s: skipped rows without a usable answer: %s", task.name, task.skipped)
    log.info("task %s: %d train / %d val problems", task.name, len(task.train), len(task.val))

    sft_dir = warm_start(model_path, task.train, cfg.sft, cfg.lora, cfg.task.system_prompt, dtype=sft_dtype)
    # The run clock (wall_s, seconds) starts here, after the SFT warm start that ESSA, GRPO and
    # F-GRPO share (engine/grpo.py starts its clock at the same point): it includes building the
    # genome and the strategy, vLLM start-up, the baselines, every generation and validation.
    t_start = time.perf_counter() - state.wall_s
    lora, _ = read_adapter(sft_dir)
    codec = make_genome(cfg.strategy.genome.kind, lora, **_genome_kwargs(cfg))
    strategy = strategy_cls(dim=codec.dim, x0=codec.x0(), seed=cfg.seed,
                            population_size=cfg.strategy.population_size, sigma0=cfg.strategy.sigma0,
                            **OmegaConf.to_container(cfg.strategy.options, resolve=True))
    if ckpt is not None:
        try:
            strategy.load_state_dict(ckpt["strategy"])
        except Exception as e:  # noqa: BLE001 - a damaged or foreign checkpoint
            raise ValueError(f"resume: the strategy state in {run_dir / CHECKPOINT} does not load "
                             f"({type(e).__name__}: {e}); start afresh without resume") from None
        _truncate_logs(run_dir, state.generation)  # only once the whole checkpoint has loaded
    log.info("genome %s: D = %d; strategy %s, P = %d", cfg.strategy.genome.kind, codec.dim,
             strategy_cls.__name__, cfg.strategy.population_size)

    method = "essa" if cfg.strategy.genome.kind == "svd_lora" else str(cfg.strategy.name)
    if ckpt is None:
        run_meta = _run_meta(cfg, method, model_path, codec.dim, sft_dir)
        run_meta["dtype"] = dtype_record(cfg.model.dtype, dtype, dtype_reason)
        run_meta["quantization"] = {"quantization": cfg.model.quantization, "serve_path": serve_path}
        io.write_json(run_dir / "run.json", run_meta)

    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    meta = AdapterMeta(cfg.lora.rank, cfg.lora.alpha, tuple(cfg.lora.target_modules), model_path)
    evaluator = build_evaluator(cfg, serve_path, codec, meta, tokenizer)
    progress.evaluator = evaluator
    sft_ref = sft_adapter_ref(sft_dir)
    metrics = io.read_rows(run_dir / "metrics.parquet")
    vrows = io.read_rows(run_dir / "validation.parquet")
    prows = io.read_rows(run_dir / VALIDATION_PROBLEMS)
    P = cfg.strategy.population_size

    def add_validation(step: int, per_problem: dict[str, np.ndarray]) -> None:
        wall = time.perf_counter() - t_start
        for cond, rewards in per_problem.items():
            acc = float(np.nan_to_num(rewards).mean())
            vrows.append({"step": step, "wall_s": wall, "condition": cond, "accuracy": acc,
                          "n_problems": len(task.val), "method": method})
            prows.extend({"step": step, "condition": cond, "problem_id": p.id, "reward": float(x)}
                         for p, x in zip(task.val, rewards))
            log.info("validation step %d: %s accuracy %.3f (%d problems)", step, cond, acc, len(task.val))
        io.write_parquet(run_dir / "validation.parquet", vrows)
        io.write_parquet(run_dir / VALIDATION_PROBLEMS, prows)

    def save_checkpoint() -> None:
        state.wall_s = time.perf_counter() - t_start
        io.write_pickle(run_dir / CHECKPOINT, {"version": CHECKPOINT_VERSION, "config_key": config_key(cfg),
                                               "config": resume_config(cfg), "run_state": state, "strategy": strategy.state_dict(),
                                               "data_cursor": state.generation + 1})
        progress.checkpoint_generation = state.generation

    def mean_ref(g: int) -> AdapterRef:  # index P is the centre evaluated in generation g: use P + 1
        return evaluator.write_candidates(strategy.mean[None, :], generation=g, first_candidate=P + 1)[0]

    if ckpt is None and cfg.eval.baselines:
        add_validation(0, validation(evaluator, {"no_adapter": None, "sft": sft_ref}, task.val, cfg))
    if (ckpt is not None and periodic_validation_due(state.generation, cfg, state.wall_s)
            and not any(r["step"] == state.generation + 1 for r in vrows)):
        # the run was interrupted in the validation after its checkpointed generation: redo it first
        log.info("resume: validation step %d was interrupted; running it again", state.generation + 1)
        add_validation(state.generation + 1,
                       validation(evaluator, {"mean": mean_ref(state.generation)}, task.val, cfg))
        evaluator.release(state.generation)
        save_checkpoint()
    stopped_by = "generations"
    slowest_s = 0.0  # this invocation's slowest generation (s), for deadline_s
    for g in range(state.generation + 1, cfg.generations):
        t0 = time.perf_counter()
        genomes = strategy.ask()  # (P, D)
        t_ask = time.perf_counter() - t0
        batch = minibatch(task.train, cfg.rollout.prompts_per_generation, cfg.seed, g)
        # the centre (the mean genome, index P) shares the prompts and sampling seeds: a paired control
        evaluated = np.vstack([genomes, strategy.mean[None, :]]) if cfg.rollout.center else genomes
        result = evaluator.evaluate(evaluated, batch, g, generation_sampling(cfg, g))
        fit = result.fitness[:P]  # (P,) mean reward of each candidate
        t1 = time.perf_counter()
        if np.isfinite(fit).any():
            shaped = fit if cfg.rollout.aggregate == "mean" else question_z_fitness(result.rewards[:P])
            strategy.tell(genomes, shaped)
        else:  # nothing scorable: an update would be meaningless; the next ask re-samples
            log.warning("gen %d: no candidate could be scored (all fitness NaN); strategy not updated", g)
        t_tell = time.perf_counter() - t1
        if np.isfinite(fit).any() and np.nanmax(fit) > state.best_fitness:
            k = int(np.nanargmax(fit))
            state.best_fitness, state.best_genome, state.best_generation = float(fit[k]), genomes[k].copy(), g
        result.rollouts["center"] = [c == P for c in result.rollouts["candidate"]]
        io.write_parquet(run_dir / "rollouts" / f"gen_{g:06d}.parquet", result.rollouts)
        row = generation_row(g, time.perf_counter() - t_start, result, P, strategy.sigma, t_ask, t_tell)
        metrics.append(row)
        io.write_parquet(run_dir / "metrics.parquet", metrics)
        log.info("gen %d (%d of %d)  fitness mean %.3f max %.3f centre %.3f  split-half rho %.2f  "
                 "sigma %.4f  %d tok  %.0f tok/s  %.1fs", g, g + 1, cfg.generations, row["fitness_mean"],
                 row["fitness_max"], row["fitness_center"], row["split_half_rho"], row["sigma"],
                 row["tokens"], row["tokens_per_s"], row["t_generate"])
        state.generation = g
        save_checkpoint()  # right after the generation's logs: an interrupted validation loses nothing
        slowest_s = max(slowest_s, time.perf_counter() - t0)
        elapsed = time.perf_counter() - t_command
        deadline = g + 1 < cfg.generations and not deadline_allows(
            cfg, g + 1, elapsed, slowest_s, result.tokens / max(len(result.rollouts["candidate"]), 1),
            row["tokens_per_s"], len(task.val))
        # decided on the checkpoint's clock, so a resume can tell whether this validation was due
        over = cfg.time_budget_s is not None and state.wall_s >= cfg.time_budget_s
        if deadline:  # the final validation covers this step: no periodic one first
            stopped_by = "deadline_s"
            log.info("deadline_s %.0f: stopping after gen %d (%d of %d) (%.0f s elapsed; a generation takes "
                     "%.0f s, then the final validation); resume=%s deadline_s=null runs the rest",
                     cfg.deadline_s, g, g + 1, cfg.generations, elapsed, slowest_s, run_dir)
            break
        if periodic_validation_due(g, cfg, state.wall_s):
            add_validation(g + 1, validation(evaluator, {"mean": mean_ref(g)}, task.val, cfg))
            evaluator.release(g)
            save_checkpoint()  # again, so the clock includes the validation
        if over:
            stopped_by = "time_budget_s"
            log.info("time budget %.0f s reached after generation %d (%.1f s)", cfg.time_budget_s, g,
                     time.perf_counter() - t_start)
            break

    # Final validation of the mean and the best genome, exports in PEFT format.
    final_step = state.generation + 1  # = generations, or fewer when the time budget stopped the run
    # the warm start again, in the same engine call as the exports: bf16 greedy decoding drifts by up
    # to ~1.6 points between calls (batch composition), which would bias the paired test against step 0
    conds: dict[str, AdapterRef | None] = {"sft": sft_ref} if cfg.eval.baselines else {}
    exports = {"mean": strategy.mean}
    if state.best_genome is not None:
        exports["best"] = state.best_genome
    for name, genome in exports.items():
        path = write_adapter(run_dir / "adapters" / name, codec.decode(genome), cfg.lora.rank, cfg.lora.alpha,
                             model_path, tuple(cfg.lora.target_modules))
        conds[name] = AdapterRef(f"final-{name}", lora_int_id(final_step, P + len(conds)), str(path))
    if final_step > 0:
        add_validation(final_step, validation(evaluator, conds, task.val, cfg))
    evaluator.close()

    from .stats import format_summary, latest_per_problem, summarise_conditions

    stats = summarise_conditions(_ordered(latest_per_problem(prows)))
    same_call = cfg.eval.baselines and final_step > 0
    print(format_summary(stats, task.name, control_note="re-scored in the final engine call, beside the exports"
                         if same_call else ""))
    if stopped_by != "generations":
        print(f"stopped by {stopped_by} after {final_step} of {cfg.generations} generations")
    io.write_json(run_dir / "summary.json", {"val": stats["accuracy"], "val_ci95": stats["ci"],
                                             "paired_vs_sft": stats["paired"], "n_problems": len(task.val),
                                             "task": task.name, "generations": final_step, "stopped_by": stopped_by,
                                             "wall_s": time.perf_counter() - t_start})
    if cfg.report:
        try:
            from .report import make_report
            make_report([run_dir], run_dir / "report")
        except ImportError:
            log.info("report module not available; skipping figures")
    return {"val": stats["accuracy"], "val_ci95": stats["ci"], "paired_vs_sft": stats["paired"],
            "n_problems": len(task.val), "run_dir": str(run_dir)}


def _genome_kwargs(cfg) -> dict:
    g = cfg.strategy.genome
    return {"alpha": g.alpha, "mode": g.mode} if g.kind == "svd_lora" else {}


def _run_meta(cfg, method: str, model_path: str, dim: int, sft_dir) -> dict:
    overrides = hydra_overrides()
    label = run_label(method, cfg.label, overrides)
    return {"method": method, "label": label, "overrides": overrides, "model": cfg.model.path,
            "model_path": model_path, "task": cfg.task.name, "seed": cfg.seed, "strategy": cfg.strategy.name,
            "population_size": cfg.strategy.population_size, "genome_dim": dim, "sft_adapter": str(sft_dir),
            "config": OmegaConf.to_container(cfg, resolve=True)}


def _ordered(per_problem: dict) -> dict:
    """Conditions in the order no_adapter, sft, mean, best (then any other)."""
    order = ["no_adapter", "sft", "mean", "best"]
    return {k: per_problem[k] for k in sorted(per_problem, key=lambda k: order.index(k) if k in order else 9)}
