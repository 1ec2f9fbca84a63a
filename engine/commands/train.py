"""``essa train``: the ESSA run loop. Warm start, then ask -> evaluate -> tell, with logs, checkpoints, exports.

ESSA (arXiv 2507.04453) Algorithm 1:
  1. SFT warm start of a LoRA adapter (engine/lora/sft.py);
  2. SVD of each LoRA factor; the genome is the offsets of the top singular values (strategies/genomes.py);
  3. each generation: the strategy asks for P candidates, all are evaluated on one fresh minibatch of N
     prompts in one multi-LoRA vLLM batch (engine/evaluation/population.py), fitness = mean reward, tell.

:func:`run_train` reads as the list of its phases: check, open or resume the run, fail fast, problems,
warm start, build the search, build the evaluator, baselines, evolve, finish. Each phase is a
function of :class:`TrainRun`, the state they share. Everything random derives from (seed,
generation) or lives in the strategy state, so a resumed run replays nothing and skips nothing
(STYLE.md rule 11; the checkpoint: engine/commands/train_checkpoint.py).
"""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine import interrupts, io
from engine.backends import AdapterRef, lora_int_id, sft_adapter_ref
from engine.lora.files import is_no_space
from engine.commands.train_checkpoint import (CHECKPOINT, RunState, open_checkpoint, restore_strategy,
                                              write_checkpoint)
from engine.commands.train_config import validate
from engine.commands.train_schedule import (base_model_price_s, condition_price_s, deadline_allows, fits_deadline,
                                            generation_sampling, periodic_validation_due, periodic_validation_fits,
                                            sampled_pass_s)
from engine.results.run_files import MetricsLog, ValidationLog, final_summary, run_metadata, truncate_run_logs
from engine.results.trackers import end_status
from engine.search.budget import next_prompts
from engine.tasks import Task, minibatch

log = logging.getLogger("essa")


@dataclass
class TrainRun:
    """What the phases of one ``essa train`` run share (filled in phase order)."""

    cfg: object
    run_dir: Path
    t_command: float  # perf_counter at the command's start: deadline_s counts from here
    state: RunState = field(default_factory=RunState)
    ckpt: dict | None = None
    model_path: str = ""
    serve_path: str = ""
    dtype: tuple[str, str] = ("", "")  # vLLM's dtype and why
    task: Task | None = None
    sft_dir: Path | None = None
    t_start: float = 0.0  # perf_counter at the run clock's zero (the end of the warm start)
    codec: object = None
    strategy: object = None
    evaluator: object = None
    validation: ValidationLog | None = None
    metrics: MetricsLog | None = None
    tracker: object = None  # the logger group's experiment tracker (engine/results/trackers.py)
    oracle: np.ndarray | None = None  # (D,) oracle_genome, for the mean's cosine with it
    condition_s: float | None = None  # measured seconds of one held-out validation condition
    stopped_by: str = "generations"
    slowest_s: float = 0.0  # this invocation's slowest generation (s), for deadline_s
    skipped: list[str] = field(default_factory=list)  # validations deadline_s skipped (summary.json)
    tokenizer: object = None
    gemm_limit: object = None  # engine.evaluation.roofline.GemmLimit, measured as evolution starts; None: not measured

    def clock(self) -> float:
        """Seconds on the run clock (``wall_s``): from the end of the SFT warm start, resumed runs included."""
        return time.perf_counter() - self.t_start

    @property
    def P(self) -> int:
        return self.cfg.strategy.population_size


@dataclass
class _Progress:
    """What an interrupted run reports: its directory, the generation of the checkpoint on disk
    (-1: none yet) and the evaluator (and tracker) to close."""

    run_dir: Path | None = None
    checkpoint_generation: int = -1
    evaluator: object = None
    tracker: object = None


def run_train(cfg, run_dir: str | Path) -> dict:
    """Run (or resume) one ESSA training job; returns the final accuracy table.

    Args:
        cfg: composed ``engine.commands.train_config.TrainConfig``.
        run_dir: Hydra's run directory (ignored when ``cfg.resume`` names another run dir).

    Returns:
        ``{"val": {condition: accuracy}, "val_ci95", "paired_vs_sft", "n_problems": int, "run_dir": str}``.

    Raises:
        ConfigError / ValueError / FileNotFoundError: bad configuration or input (one-line messages).
        KeyboardInterrupt: Ctrl-C (SIGINT), also when another exception follows it (vLLM's
            ``EngineDeadError`` once the signal reached the engine's own process,
            :mod:`engine.interrupts`). The checkpoint of the last finished generation, written
            right after it, is left as it is (the strategy may already have asked for the next
            generation); one line on stderr says how to resume, or that nothing can be resumed.
    """
    progress = _Progress()
    ended: BaseException | None = None
    try:
        return _run_train(cfg, run_dir, progress)
    except BaseException as exc:
        ended = exc
        if is_no_space(exc) and progress.run_dir is not None:
            _close_evaluator(progress)
            raise io.NoSpaceError(f"no space left on the device while writing (under {progress.run_dir} or engine.adapter_dir): "
                          f"free space and continue with essa train resume={progress.run_dir} (the checkpoint of "
                          f"generation {progress.checkpoint_generation} is kept)") from exc
        if not isinstance(exc, KeyboardInterrupt) and not interrupts.requested():
            raise
        _report_interrupt(progress, exc)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise KeyboardInterrupt(f"interrupted ({type(exc).__name__} after Ctrl-C)") from exc
    finally:
        if progress.tracker is not None:  # FAILED / KILLED in the tracker (a finished run closed it already)
            progress.tracker.close(*end_status(ended))


def _close_evaluator(progress: _Progress) -> None:
    """Close the evaluator and its engine (vLLM's processes, the candidates' adapter directory), if any."""
    ev = progress.evaluator
    if ev is None:
        return
    for close in (getattr(getattr(ev, "backend", None), "close", None), ev.close):
        if close is None:
            continue
        try:
            close()
        except BaseException as e:  # noqa: BLE001 - a dead engine, or a second Ctrl-C: we are exiting anyway
            log.warning("closing the evaluator after the stop failed: %s: %s", type(e).__name__, e)


def _run_train(cfg, run_dir: str | Path, progress: _Progress) -> dict:
    """:func:`run_train`'s phases; records in ``progress`` what an interrupt message needs."""
    run = TrainRun(cfg, Path(run_dir), time.perf_counter())
    validate(cfg)
    open_run(run, progress)
    strategy_cls = fail_fast(run)
    load_problems(run)
    warm_start_phase(run)
    build_search_phase(run, strategy_cls)
    build_evaluator_phase(run, progress)
    baselines(run, progress)
    evolve(run, progress)
    return finish(run)


def open_run(run: TrainRun, progress: _Progress) -> None:
    """A new run in Hydra's directory, or the checkpointed run ``resume`` names (checked: see
    :func:`engine.commands.train_checkpoint.open_checkpoint`)."""
    if run.cfg.resume:
        run.run_dir, run.ckpt, run.state = open_checkpoint(run.cfg)
        continue_log_in(run.run_dir)
    progress.run_dir = run.run_dir
    progress.checkpoint_generation = run.state.generation  # -1 in a new run
    run.run_dir.mkdir(parents=True, exist_ok=True)


def continue_log_in(run_dir: Path) -> None:
    """A resumed run's log also goes to the resumed directory's own log file (appended), beside the
    new directory Hydra opened for this invocation, so one run keeps one log. Hydra's log handler is
    the one its job_logging config names ``file``."""
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h, logging.FileHandler) and h.get_name() == "file"]:
        target = run_dir / Path(h.baseFilename).name
        if not target.exists() and (run_dir / "hydra_app.log").is_file():  # a run from before jobs were named
            target = run_dir / "hydra_app.log"                              # after their command (train.log)
        logged = [Path(f.baseFilename) for f in root.handlers if isinstance(f, logging.FileHandler)]
        if not any(_same_file(f, target) for f in logged):
            extra = logging.FileHandler(target, mode="a")
            extra.setFormatter(h.formatter)
            extra.setLevel(h.level)
            root.addHandler(extra)
            log.info("resume: logging to %s as well (this invocation's own directory: %s)", target,
                     Path(h.baseFilename).parent)


def _same_file(a: Path, b: Path) -> bool:
    """Same file (a symlink or hard link counts); a path that does not exist yet is compared by name."""
    try:
        return a.samefile(b)
    except OSError:
        return a.resolve() == b.resolve()


def fail_fast(run: TrainRun):
    """Everything that can be refused before the warm start: the strategy class and its options, the
    model path, the dtypes, the quantized copy vLLM serves; logs the strategy and the genome it will
    search, with D (:func:`engine.search.search_line`). Returns the strategy class."""
    from engine.backends import require_vllm
    from engine.hardware import resolve_dtype, resolve_numerics
    from engine.model import local_model_config, resolve_model_path, serving_model_path
    from engine.search import check_strategy_options, search_line, strategy_class

    require_vllm()  # before the warm start: one line naming the extras
    cfg = run.cfg
    strategy_cls = strategy_class(cfg.strategy)
    check_strategy_options(strategy_cls, cfg.strategy, cfg.seed)
    run.model_path = resolve_model_path(cfg.model.path)
    log.info(search_line(cfg.strategy, strategy_cls, cfg.lora, local_model_config(run.model_path)))
    run.dtype = resolve_dtype(cfg.model.dtype)  # vLLM's; logs one line
    resolve_numerics(cfg.engine.numerics, run.dtype[0])  # engine.numerics=invariant needs float32 on a CPU
    # vLLM serves the population on this checkpoint: the float model, or its quantized copy
    # (model.quantization, built once and checked here); SFT and adapters stay float
    run.serve_path = serving_model_path(run.model_path, cfg.model.quantization, run.dtype[0])
    return strategy_cls


def load_problems(run: TrainRun) -> None:
    """The task's train and held-out problems (engine/tasks.py)."""
    from engine.tasks import load_task

    run.task = load_task(run.cfg.task)
    if run.task.skipped:
        log.warning("task %s: skipped rows without a usable answer: %s", run.task.name, run.task.skipped)
    log.info("task %s: %d train / %d val problems", run.task.name, len(run.task.train), len(run.task.val))
    if run.cfg.rollout.fitness == "likelihood" and not all(p.solution for p in run.task.train):
        raise ValueError(f"rollout.fitness=likelihood: task {run.task.name!r} has training problems without a worked "
                         "solution to score; use a task with solutions (task=arithmetic, gsm8k) or rollout.fitness=reward")


def warm_start_phase(run: TrainRun) -> None:
    """The SFT warm start (cached), then the run clock starts: ``wall_s`` counts from the end of the
    warm start that ESSA, GRPO and F-GRPO share (engine/commands/grpo.py starts its clock there too)
    and includes building the search, vLLM start-up, the baselines, every generation and validation."""
    from engine.hardware import resolve_dtype
    from engine.lora.sft import warm_start

    cfg = run.cfg
    sft_dtype, _ = resolve_dtype(cfg.model.dtype, purpose="training", log_choice=False)
    run.sft_dir = warm_start(run.model_path, run.task.train, cfg.sft, cfg.lora, cfg.task.system_prompt,
                             dtype=sft_dtype)
    run.t_start = time.perf_counter() - run.state.wall_s


def build_search_phase(run: TrainRun, strategy_cls) -> None:
    """The genome codec over the warm start and the strategy (restored from the checkpoint when
    resuming, whose later log rows are then dropped); a new run writes run.json."""
    from engine.hardware import dtype_record
    from engine.lora.files import read_adapter
    from engine.search import build_search, method_name

    cfg = run.cfg
    lora, _ = read_adapter(run.sft_dir)
    run.codec, run.strategy = build_search(cfg.strategy, lora, cfg.seed, strategy_cls)
    if run.ckpt is not None:
        restore_strategy(run.strategy, run.ckpt, run.run_dir)
        truncate_run_logs(run.run_dir, run.state.generation)  # only once the whole checkpoint has loaded
    log.info("genome %s: D = %d; strategy %s, P = %d", cfg.strategy.genome.kind, run.codec.dim,
             strategy_cls.__name__, run.P)
    run.oracle = load_oracle(cfg.oracle_genome, run.codec.dim)
    if run.ckpt is None:
        from omegaconf import OmegaConf
        meta = run_metadata(method_name(cfg.strategy), cfg.label, cfg.model.path, run.model_path, cfg.task.name,
                            cfg.seed, run.sft_dir, OmegaConf.to_container(cfg, resolve=True),
                            strategy=cfg.strategy.name, population_size=run.P, genome_dim=run.codec.dim,
                            dtype=dtype_record(cfg.model.dtype, *run.dtype),
                            quantization={"quantization": cfg.model.quantization, "serve_path": run.serve_path})
        io.write_json(run.run_dir / "run.json", meta)


def load_oracle(path: str | None, dim: int) -> np.ndarray | None:
    """The (D,) genome of ``oracle_genome`` (a .npy file), or None.

    Raises:
        ValueError: unreadable, or not a finite vector of the genome's length D (one line, with the fix).
    """
    if not path:
        return None
    try:
        x = np.load(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"oracle_genome={path}: not a readable .npy file ({type(e).__name__}); pass the genome "
                         f"tools/genome_capacity.py saved, or drop oracle_genome") from None
    if x.shape != (dim,) or not np.isfinite(x).all():
        raise ValueError(f"oracle_genome={path}: shape {x.shape}, expected ({dim},) finite values (this run's genome "
                         "length D); pass the oracle of the same genome (strategy.genome, lora.rank)")
    return x.astype(np.float64)


def build_evaluator_phase(run: TrainRun, progress: _Progress) -> None:
    """The population evaluator (``engine.backend``: local vLLM or Ray actors) and the run's logs."""
    from transformers import AutoTokenizer

    from omegaconf import OmegaConf

    from engine.evaluation.build import build_evaluator, task_reward
    from engine.lora.files import AdapterMeta
    from engine.results.run_files import hydra_overrides, run_label
    from engine.results.trackers import make_tracker
    from engine.search import method_name

    cfg = run.cfg
    tokenizer = run.tokenizer = AutoTokenizer.from_pretrained(run.model_path)
    meta = AdapterMeta(cfg.lora.rank, cfg.lora.alpha, tuple(cfg.lora.target_modules), run.model_path)
    run.evaluator = progress.evaluator = build_evaluator(
        cfg.engine, cfg.model, run.serve_path, run.codec, meta, tokenizer, task_reward(cfg.task, cfg.reward),
        cfg.task.system_prompt, cfg.seed, adapters_per_batch=run.P + 2, dense=cfg.rollout.dense != "off")
    run.tracker = progress.tracker = make_tracker(cfg.logger, run.run_dir, OmegaConf.to_container(cfg, resolve=True),
                                                  run_label(method_name(cfg.strategy), cfg.label, hydra_overrides()))
    run.metrics = MetricsLog(run.run_dir, run.tracker)
    run.validation = ValidationLog(run.run_dir, method_name(cfg.strategy), run.task.val, run.clock, run.tracker)


def validate_held_out(run: TrainRun, step: int, conditions: dict[str, AdapterRef | None],
                      cached: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Score ``conditions`` on the held-out problems in one engine call and log them at ``step`` with the
    ``cached`` conditions' rewards (``{condition: (N,)}``, scored by an earlier call); keeps the measured
    seconds per scored condition for ``deadline_s``'s projection. Returns the scored rewards."""
    from engine.evaluation.validation import held_out_rewards

    t0 = time.perf_counter()
    rewards = held_out_rewards(run.evaluator, conditions, run.task.val, run.cfg.eval.max_tokens, run.cfg.seed)
    run.condition_s = (time.perf_counter() - t0) / max(len(conditions), 1)
    run.validation.add(step, {**(cached or {}), **rewards})
    return rewards


SAME_CALL = "scored again in the same final engine call as the ES adapters (a paired test)"


def validate_final(run: TrainRun, step: int, conds: dict[str, AdapterRef | None]) -> str:
    """The final paired call. In float32 the warm start gives the same greedy answers in every engine call
    (issue 37), so its per-problem rewards come from the warm-start cache when an earlier run scored the
    same adapter, model and problems (:func:`cached_warm_start`; scored and cached otherwise); in bf16
    it is always scored in this call, beside the exports. Where the engine's kernels move answers with
    the batch slot (AMX bf16 under ``engine.numerics`` fast) a byte copy of the warm start rides in the
    same call, and the table's note says on how many held-out verdicts it disagreed with the warm start:
    the numerics floor a gain is read against (issue 42). Returns the table's note on the warm start."""
    from engine.evaluation.validation import held_out_rewards

    sft = cached_warm_start(run) if "sft" in conds else None
    if sft is not None:
        validate_held_out(run, step, {k: v for k, v in conds.items() if k != "sft"}, cached={"sft": sft})
        log.info("final call: the warm start's held-out rewards from the warm-start cache (float32: the same "
                 "greedy answers in every engine call)")
        return ("its per-problem rewards from the float32 warm-start cache (the same greedy answers in every "
                "engine call), paired with the ES adapters' on the same problems")
    copy = numerics_copy(run, conds, step)
    if copy is None:
        rewards = validate_held_out(run, step, conds)
        if "sft" in rewards:
            cached_warm_start(run, scored=rewards["sft"])
        return SAME_CALL
    t0 = time.perf_counter()
    rewards = held_out_rewards(run.evaluator, {**conds, "sft_copy": copy}, run.task.val, run.cfg.eval.max_tokens,
                               run.cfg.seed)
    run.condition_s = (time.perf_counter() - t0) / (len(conds) + 1)
    flips = int(np.sum(rewards.pop("sft_copy") != rewards["sft"]))
    run.validation.add(step, rewards)
    log.info("numerics floor: a copy of the warm start disagreed with it on %d of %d verdicts", flips,
             len(run.task.val))
    return SAME_CALL + (f"; numerics floor: a byte copy of the warm start in the same call disagreed with it on "
                        f"{flips} of {len(run.task.val)} verdicts (engine.numerics=invariant removes it)")


def numerics_copy(run: TrainRun, conds: dict[str, AdapterRef | None], step: int) -> AdapterRef | None:
    """A second id for the warm start's adapter when this engine's answers can move with the batch slot
    (bf16 with AMX and ``engine.numerics`` fast) and the warm start is in the final call, else None."""
    from engine.hardware import detect_device

    sft = conds.get("sft")
    backend = getattr(run.evaluator, "backend", None)
    if sft is None or getattr(backend, "numerics", "invariant") != "fast" or getattr(backend, "dtype", "") == "float32":
        return None
    if "amx_bf16" not in detect_device().cpu.flags:
        return None
    return AdapterRef("final-sft-copy", lora_int_id(step, run.P + 63), sft.path)


def warm_start_cacheable(dtype: str) -> bool:
    """Whether the warm start's held-out rewards may be reused from an earlier engine call: float32 only
    (the same adapter gave the same greedy answers in separate calls and every batch slot, issues 37 and
    42); bf16 answers drift between calls, so there the warm start stays in the final call."""
    return dtype == "float32"


def cached_warm_start(run: TrainRun, scored: np.ndarray | None = None) -> np.ndarray | None:
    """The warm start's ``(N,)`` held-out rewards from ``$ESSA_CACHE/warm_start`` (key: the served model,
    the adapter's bytes, dtype, engine numerics and LoRA kernels, prompt, problems, decoding, vLLM), or
    None on a miss; with ``scored`` (this run's own rewards) a miss stores them. Always None outside
    float32 (:func:`warm_start_cacheable`)."""
    from engine.backends.fast_lora.plugin import vllm_version
    from engine.evaluation.validation import adapter_digest, cached_rewards
    from engine.model import cache_dir

    cfg = run.cfg
    if not warm_start_cacheable(run.dtype[0]) or run.sft_dir is None:
        return None
    key = {"model": run.serve_path, "adapter": adapter_digest(run.sft_dir), "dtype": run.dtype[0],
           "numerics": str(cfg.engine.numerics), "fast_lora": bool(cfg.engine.fast_lora),
           "system_prompt": cfg.task.system_prompt, "max_tokens": cfg.eval.max_tokens,
           "problems": [(p.id, p.question, p.answer) for p in run.task.val], "vllm": vllm_version()}
    rewards, _ = cached_rewards(cache_dir() / "warm_start", key,
                                lambda: None if scored is None else {"sft": scored})
    return None if rewards is None else rewards["sft"]


def base_model_rewards(run: TrainRun, score: bool = True) -> dict[str, np.ndarray] | None:
    """``{"no_adapter": (N,) rewards}`` of the held-out problems, from the baseline cache when an earlier
    run scored the same model, dtype, problems and decoding (engine/evaluation/validation.py), else
    scored now (and cached); None on a miss when not ``score``."""
    from engine.backends.fast_lora.plugin import vllm_version
    from engine.evaluation.validation import cached_rewards, held_out_rewards
    from engine.model import cache_dir

    cfg = run.cfg
    key = {"model": run.serve_path, "dtype": run.dtype[0], "system_prompt": cfg.task.system_prompt,
           "max_tokens": cfg.eval.max_tokens, "problems": [(p.id, p.question, p.answer) for p in run.task.val],
           "vllm": vllm_version()}
    rewards, hit = cached_rewards(cache_dir() / "baselines", key, lambda: held_out_rewards(
        run.evaluator, {"no_adapter": None}, run.task.val, cfg.eval.max_tokens, cfg.seed) if score else None)
    if hit:
        log.info("validation step 0: the base model's held-out rewards from the baseline cache (same model, dtype, "
                 "problems and decoding)")
    return rewards


def mean_ref(run: TrainRun, g: int) -> AdapterRef:
    """The strategy's mean genome written as an adapter for validation after generation ``g`` (index
    P is the centre evaluated in generation g: the mean uses P + 1)."""
    return run.evaluator.write_candidates(run.strategy.checked_mean()[None, :], generation=g, first_candidate=run.P + 1)[0]


def save_checkpoint(run: TrainRun, progress: _Progress) -> None:
    """The checkpoint of the last finished generation, with the run clock as it stands."""
    run.state.wall_s = run.clock()
    write_checkpoint(run.run_dir, run.cfg, run.state, run.strategy)
    progress.checkpoint_generation = run.state.generation


def baselines(run: TrainRun, progress: _Progress) -> None:
    """Step 0 of a new run (``eval.baselines``): the base model without an adapter, scored once per model,
    dtype, task and decoding and cached (``$ESSA_CACHE/baselines``). The warm start is scored once, in
    the final engine call beside the exports, where the paired test needs it (in float32 from
    ``$ESSA_CACHE/warm_start`` when an earlier run scored the same adapter: :func:`validate_final`);
    genome zero is the warm start, so the mean genome's curve starts there. Under ``deadline_s`` a base model not in the cache is
    scored after the final call, if it still fits (:func:`_late_base_model`): generations come first. A
    resumed run whose periodic validation after its checkpointed generation was interrupted redoes it first."""
    cfg, state = run.cfg, run.state
    if run.ckpt is None and cfg.eval.baselines:
        rewards = base_model_rewards(run, score=cfg.deadline_s is None or cfg.generations == 0)
        if rewards is None:
            log.info("deadline_s %.0f: the base model's held-out score is not cached; it is scored after the final "
                     "call if it still fits (generations first)", cfg.deadline_s)
        else:
            run.validation.add(0, rewards)
    if (run.ckpt is not None and periodic_validation_due(state.generation, cfg, state.wall_s)
            and not run.validation.has_step(state.generation + 1)
            and state.generation + 1 not in state.skipped_steps):  # deadline_s skipped it: not interrupted
        log.info("resume: validation step %d was interrupted; running it again", state.generation + 1)
        validate_held_out(run, state.generation + 1, {"mean": mean_ref(run, state.generation)})
        run.evaluator.release(state.generation)
        save_checkpoint(run, progress)


def evolve(run: TrainRun, progress: _Progress) -> None:
    """The generations still to run: each is evaluated, told, logged and checkpointed, then the
    deadline, the periodic validation and the time budget are decided (in that order); under
    ``deadline_s`` a periodic validation runs only if it costs no generation (:func:`_deadline_decision`)."""
    cfg = run.cfg
    if run.state.generation + 1 < cfg.generations:
        run.gemm_limit = measure_gemm_limit(run)
    for g in range(run.state.generation + 1, cfg.generations):
        t0 = time.perf_counter()
        result, row = generation(run, g)
        save_checkpoint(run, progress)  # right after the generation's logs: an interrupted validation loses nothing
        run.slowest_s = max(run.slowest_s, time.perf_counter() - t0)
        # decided on the checkpoint's clock, so a resume can tell whether the validation below was due
        over = cfg.time_budget_s is not None and run.state.wall_s >= cfg.time_budget_s
        decision = _deadline_decision(run, g, result, row)
        if decision == "stop":  # the final validation covers this step: no periodic one first
            break
        if decision == "skip validation":
            save_checkpoint(run, progress)  # with the skipped step: a resume must not redo it as "interrupted"
        if decision == "run" and periodic_validation_due(g, cfg, run.state.wall_s):
            validate_held_out(run, g + 1, {"mean": mean_ref(run, g)})
            run.evaluator.release(g)
            save_checkpoint(run, progress)  # again, so the clock includes the validation
        if over:
            run.stopped_by = "time_budget_s"
            log.info("time budget %.0f s reached after generation %d (%.1f s)", cfg.time_budget_s, g, run.clock())
            break


def measure_gemm_limit(run: TrainRun, seconds: float = 1.0):
    """Torch's GEMM rate on the model's shapes in the run's dtype, in this process, once (about
    ``seconds``; engine/evaluation/roofline.py), at M = one decode step's sequences (the generation's
    requests, capped by ``engine.max_num_seqs``); None without a local config.json. Logged."""
    from engine.evaluation.roofline import GemmLimit, ModelShapes
    from engine.model import local_model_config

    cfg = run.cfg
    config = local_model_config(run.model_path)
    if config is None or cfg.rollout.fitness == "likelihood":
        return None
    requests = (run.P + 1) * (run.state.prompts or cfg.rollout.prompts_per_generation)
    rows = min(requests, int(cfg.engine.max_num_seqs))
    limit = GemmLimit.measure(ModelShapes.from_config(config), rows, run.dtype[0], seconds)
    log.info("roofline: torch GEMM %.1f GFLOP/s on the model's shapes (%s, M %d, this process); metrics.parquet's "
             "roofline_fraction is each generation's share of it", limit.gflops, run.dtype[0], rows)
    return limit


def generation_roofline(run: TrainRun, result, batch, adapters: int) -> float:
    """The generation's ``roofline_fraction``: GEMM FLOP/s of its prompt tokens (once per request) and
    completion tokens over :attr:`TrainRun.gemm_limit`; NaN when not measured."""
    from engine.evaluation.roofline import prompt_tokens
    from engine.prompts import build_prompt

    if run.gemm_limit is None or run.tokenizer is None:
        return float("nan")
    prompts = [build_prompt(run.tokenizer, p.question, run.cfg.task.system_prompt) for p in batch]
    return run.gemm_limit.fraction(adapters * prompt_tokens(run.tokenizer, prompts), result.tokens,
                                   result.timings.get("generate", 0.0))


def generation(run: TrainRun, g: int):
    """One generation: ask P candidates, evaluate them (and the centre) on the generation's minibatch in
    one batch, tell the (shaped) fitness, pull the mean back (``strategy.mean_decay``), log metrics and
    rollouts. Returns (EvalResult, metrics row)."""
    from engine.evaluation.population import shaped_fitness

    cfg, P, strategy = run.cfg, run.P, run.strategy
    t0 = time.perf_counter()
    placebo = cfg.rollout.placebo  # P copies of the mean, nothing told: the numerics floor (issue 42)
    genomes = np.tile(strategy.checked_mean()[None, :], (P, 1)) if placebo else strategy.ask()  # (P, D)
    t_ask = time.perf_counter() - t0
    n_prompts = run.state.prompts or cfg.rollout.prompts_per_generation
    batch = minibatch(run.task.train, n_prompts, cfg.seed, g)
    # the centre (the mean genome, index P) shares the prompts and sampling seeds: a paired control
    evaluated = np.vstack([genomes, strategy.checked_mean()[None, :]]) if cfg.rollout.center else genomes
    if cfg.rollout.fitness == "likelihood":  # the worked solutions' log-likelihood, prefill only
        result = run.evaluator.evaluate_likelihood(evaluated, batch, g)
    else:
        result = run.evaluator.evaluate(evaluated, batch, g, generation_sampling(cfg.rollout, cfg.seed, g))
    fit = result.fitness[:P]  # (P,) mean reward of each candidate
    t1 = time.perf_counter()
    if placebo:
        log.info("gen %d: placebo generation (P copies of the mean genome), strategy not updated", g)
    elif np.isfinite(fit).any():
        r = cfg.rollout
        strategy.tell(genomes, shaped_fitness(result, P, r.aggregate, r.dense, r.dense_weight))
        if not strategy.tied:  # a fully tied generation leaves the mean where it is (strategies/base.py)
            strategy.shrink_mean(1.0 - cfg.strategy.mean_decay)
        _keep_best(run.state, genomes, fit, g)
    else:  # nothing scorable: an update would be meaningless; the next ask re-samples
        log.warning("gen %d: no candidate could be scored (all fitness NaN); strategy not updated", g)
    t_tell = time.perf_counter() - t1
    result.rollouts["center"] = [c == P for c in result.rollouts["candidate"]]
    io.write_parquet(run.run_dir / "rollouts" / f"gen_{g:06d}.parquet", result.rollouts)
    row = generation_row(g, run.clock(), result, P, strategy.sigma, t_ask, t_tell,
                         roofline=generation_roofline(run, result, batch, len(evaluated)))
    row.update(search_row(run, n_prompts))
    run.metrics.add(row)
    log.info("gen %d (%d of %d)  fitness mean %.3f max %.3f centre %.3f  split-half rho %.2f  sigma %.4f  "
             "%d tok  %.0f tok/s (%.0f %% of the GEMM limit)  %.1fs", g, g + 1, cfg.generations, row["fitness_mean"],
             row["fitness_max"], row["fitness_center"], row["split_half_rho"], row["sigma"], row["tokens"],
             row["tokens_per_s"], 100 * row["roofline_fraction"], row["t_generate"])
    run.state.generation = g
    run.state.prompts = next_prompts(cfg.rollout, n_prompts, row["split_half_rho"])
    return result, row


def search_row(run: TrainRun, n_prompts: int) -> dict:
    """Where the search stands after a generation: N, the mean genome's distance from genome zero
    (``mean_norm``, the drift), whether the tell was fully tied and so moved nothing (``all_tied``), the
    mean's cosine with ``oracle_genome`` when one is given."""
    mean = run.strategy.checked_mean()
    row = {"prompts": n_prompts, "mean_norm": float(np.linalg.norm(mean - run.strategy.x0)),
           "all_tied": bool(run.strategy.tied)}
    if run.oracle is not None:
        denom = np.linalg.norm(mean) * np.linalg.norm(run.oracle)
        row["mean_cos_oracle"] = float(mean @ run.oracle / denom) if denom > 0 else float("nan")
    return row


def _keep_best(state: RunState, genomes: np.ndarray, fit: np.ndarray, g: int) -> None:
    """Remember the candidate with the highest minibatch fitness seen (a noisy pick: ``adapters/best``)."""
    if np.nanmax(fit) > state.best_fitness:
        k = int(np.nanargmax(fit))
        state.best_fitness, state.best_genome, state.best_generation = float(fit[k]), genomes[k].copy(), g


def _deadline_decision(run: TrainRun, g: int, result, row: dict) -> str:
    """What ``deadline_s`` lets happen after generation ``g``: ``"run"`` (the periodic validation due now,
    if any, then generation g + 1), ``"skip validation"`` (the periodic validation due now would cost a
    generation: :func:`periodic_validation_fits`; the final call scores the mean anyway) or ``"stop"``
    (:func:`deadline_allows`); logs the last two."""
    cfg = run.cfg
    if g + 1 >= cfg.generations or cfg.deadline_s is None:
        return "run"
    elapsed = time.perf_counter() - run.t_command
    per_completion = result.tokens / max(len(result.rollouts["candidate"]), 1)
    condition_s = condition_price_s(cfg, len(run.task.val), per_completion, row["tokens_per_s"], run.condition_s)
    if not deadline_allows(cfg, g + 1, elapsed, run.slowest_s, condition_s):
        run.stopped_by = "deadline_s"
        log.info("deadline_s %.0f: stopping after gen %d (%d of %d) (%.0f s elapsed; a generation takes %.0f s, "
                 "then the final validation); resume=%s deadline_s=null runs the rest", cfg.deadline_s, g, g + 1,
                 cfg.generations, elapsed, run.slowest_s, run.run_dir)
        return "stop"
    if periodic_validation_due(g, cfg, run.state.wall_s) and not periodic_validation_fits(
            cfg, g + 1, elapsed, run.slowest_s, condition_s):
        run.skipped.append(f"validation step {g + 1}")
        run.state.skipped_steps.append(g + 1)
        log.info("deadline_s %.0f: skipping validation step %d, which would cost a generation (the final call "
                 "scores the mean genome; deadline_s=null runs every validation)", cfg.deadline_s, g + 1)
        return "skip validation"
    return "run"


def generation_row(g: int, wall_s: float, result, P: int, sigma: float, t_ask: float, t_tell: float,
                   roofline: float = float("nan")) -> dict:
    """One metrics.parquet row: fitness of the P candidates, the centre (index P, when evaluated),
    the signal diagnostics of engine/results/stats.py (``one_text_share`` NaN under rollout.fitness=likelihood,
    which writes no text), the answer checks that hit reward.timeout_s
    (``n_timeouts``, completions scored NaN), tokens and seconds per phase, and ``roofline_fraction``
    (the generate call's share of the measured GEMM limit, :func:`generation_roofline`; NaN: not measured)."""
    from engine.results.stats import (one_text_share, pairwise_discordance, prompts_disagreeing,
                                      split_half_rank_correlation, variance_ratio)

    fit, rewards = result.fitness[:P], result.rewards[:P]
    ok = np.isfinite(fit).any()
    tm = result.timings
    stat = (lambda f: float(f(fit))) if ok else (lambda f: float("nan"))
    status = list(result.rollouts.get("status", ()))
    wrote_text = not status or any(s != "likelihood" for s in status)
    row = {"generation": g, "wall_s": wall_s, "fitness_mean": stat(np.nanmean), "fitness_max": stat(np.nanmax),
           "fitness_min": stat(np.nanmin), "fitness_std": stat(np.nanstd),
           "fitness_center": float(result.fitness[P]) if len(result.fitness) > P else float("nan"),
           "split_half_rho": split_half_rank_correlation(rewards), "variance_ratio": variance_ratio(rewards),
           "prompts_disagreeing": prompts_disagreeing(rewards), "fitness_var": stat(np.nanvar),
           "pairwise_discordance": pairwise_discordance(rewards),
           "one_text_share": one_text_share(candidate_texts(result.rollouts, P, rewards.shape[1])) if wrote_text
           else float("nan"),
           "n_failed": int((~np.isfinite(fit)).sum()),
           "n_timeouts": status.count("timeout"), "sigma": float(sigma),
           "tokens": result.tokens, "tokens_per_s": result.tokens / max(tm.get("generate", 0.0), 1e-9),
           "t_ask": t_ask, "t_decode": tm.get("decode", 0.0), "t_write": tm.get("write", 0.0),
           "t_generate": tm.get("generate", 0.0), "t_reward": tm.get("reward", 0.0), "t_tell": t_tell,
           "roofline_fraction": float(roofline)}
    if result.dense is not None:
        from engine.evaluation.population import candidate_dense

        d = candidate_dense(result.dense)  # (P [+ centre],) mean log p of the reference answer, nats
        row.update(dense_mean=float(np.nanmean(d[:P])), dense_max=float(np.nanmax(d[:P])),
                   dense_center=float(d[P]) if len(d) > P else float("nan"))
    row.update({f"t_{k}": v for k, v in tm.items() if f"t_{k}" not in row})
    return row


def candidate_texts(rollouts: dict, P: int, N: int) -> list[list[str]]:
    """[P][N] first-sample completion texts of the first P candidates from a generation's rollout columns
    (rows in candidate, prompt, sample order; likelihood rollouts have empty texts)."""
    G = max(len(rollouts["completion"]) // max(len(set(rollouts["candidate"])) * N, 1), 1)
    return [[rollouts["completion"][(p * N + n) * G] for n in range(N)] for p in range(P)]


def finish(run: TrainRun) -> dict:
    """Export the mean and best genomes (PEFT), validate them beside the SFT warm start in one final
    engine call (and, with ``eval.samples``, sample the warm start and the mean genome), print the
    table, write summary.json and the report."""
    cfg, state = run.cfg, run.state
    final_step = state.generation + 1  # = generations, or fewer when a budget stopped the run
    conds = _export_adapters(run, final_step)
    sampled = None
    control_note = ""
    if final_step > 0:
        log.info("final call: %s on %d held-out problems (greedy)", ", ".join(conds), len(run.task.val))
        control_note = validate_final(run, final_step, conds)
        _late_base_model(run)
        sampled = sampled_metrics(run, {k: conds[k] for k in ("sft", "mean") if k in conds})
    run.evaluator.close()
    summary = final_summary(run.run_dir, run.validation.summary(), run.task.name,
                            control_note if cfg.eval.baselines and final_step > 0 else "",
                            n_problems=len(run.task.val), generations=final_step, stopped_by=run.stopped_by,
                            wall_s=run.clock(), tracker=run.tracker, **({"sampled": sampled} if sampled else {}),
                            **({"skipped_by_deadline": run.skipped} if run.skipped else {}))
    if sampled:
        print(format_sampled(sampled))
    if run.stopped_by != "generations":
        print(f"stopped by {run.stopped_by} after {final_step} of {cfg.generations} generations")
    if run.skipped:
        print(f"skipped so that generations fit deadline_s ({final_step} of {cfg.generations} ran): "
              f"{', '.join(run.skipped)}; deadline_s=null runs everything")
    if cfg.report:
        from engine.results.report import make_report
        figures = make_report([run.run_dir], run.run_dir / "report")
        run.tracker.log_images({p.stem: p for p in figures if p.suffix == ".png"})
    run.tracker.close()
    return {"val": summary["val"], "val_ci95": summary["val_ci95"], "paired_vs_sft": summary["paired_vs_sft"],
            "n_problems": summary["n_problems"], "run_dir": str(run.run_dir)}


def sampled_metrics(run: TrainRun, conds: dict[str, AdapterRef | None]) -> dict | None:
    """mean@n and pass@n (unbiased, Chen et al. 2021 Eq. 1) of ``conds`` on the first ``eval.sample_problems``
    held-out problems, ``eval.samples`` answers each at ``eval.sample_temperature``, in one engine call;
    None when ``eval.samples`` is 0, or when it would end past ``deadline_s`` (:func:`_sampled_pass_fits`;
    logged with the ``essa eval`` command that scores it). A sample that could not be scored counts as wrong."""
    from engine.backends import Sampling
    from engine.results.passk import pass_at_k

    e = run.cfg.eval
    if not e.samples or not conds or not _sampled_pass_fits(run):
        return None
    problems = run.task.val[: e.sample_problems]
    sampling = Sampling(max_tokens=e.max_tokens, temperature=e.sample_temperature, n=e.samples,
                        seed=run.cfg.seed + 7919, common_seeds=True)
    log.info("final call, sampled pass: %s on %d held-out problems x %d samples at temperature %g (mean@%d, pass@%d)",
             ", ".join(conds), len(problems), e.samples, e.sample_temperature, e.samples, e.samples)
    rewards, *_ = run.evaluator.score(list(conds.values()), problems, sampling)  # (A, N, n)
    correct = (np.nan_to_num(rewards) > 0.5).sum(axis=2)  # (A, N)
    return {name: {"mean_at_n": float(np.nan_to_num(rewards[a]).mean()),
                   "pass_at_n": float(pass_at_k(e.samples, correct[a], e.samples).mean()),
                   "n": int(e.samples), "temperature": float(e.sample_temperature), "n_problems": len(problems)}
            for a, name in enumerate(conds)}


def _late_base_model(run: TrainRun) -> None:
    """The base model's step-0 score when :func:`baselines` left it to the end (``deadline_s``, not cached):
    from the cache, or scored (and cached) if :func:`base_model_price_s` seconds still fit the deadline, else listed
    as skipped."""
    cfg = run.cfg
    if not cfg.eval.baselines or any(r["condition"] == "no_adapter" for r in run.validation.rows):
        return
    rewards = base_model_rewards(run, score=False)
    hint = "one run with deadline_s=null (make run DEADLINE_S=null) scores and caches it for every later run"
    if rewards is None and _extra_fits(run, "base model", base_model_price_s(run.condition_s or 0.0), hint):
        rewards = base_model_rewards(run)
    if rewards is not None:
        run.validation.add(0, rewards)


def _sampled_pass_fits(run: TrainRun) -> bool:
    """Whether the sampled pass still fits ``deadline_s`` after the final greedy call; logs a skip."""
    cfg, e = run.cfg, run.cfg.eval
    need_s = sampled_pass_s(cfg, run.condition_s or 0.0, len(run.task.val))
    adapters = ([str(run.sft_dir)] if cfg.eval.baselines else []) + [str(run.run_dir / "adapters" / "mean")]
    hint = (f"essa eval adapters=[{','.join(adapters)}] include_base=false n={e.samples} "
            f"temperature={e.sample_temperature:g} limit={e.sample_problems} max_tokens={e.max_tokens} "
            "(with the run's model and task overrides; it reports mean@n as avg@n)")
    return _extra_fits(run, "sampled pass", need_s, hint)


def _extra_fits(run: TrainRun, name: str, need_s: float, hint: str) -> bool:
    """Whether ``name``, an extra of the final call (about ``need_s`` seconds), still fits ``deadline_s``;
    when not, it is listed in ``run.skipped`` and logged with ``hint`` (how to get it anyway)."""
    cfg = run.cfg
    elapsed = time.perf_counter() - run.t_command
    if fits_deadline(cfg, elapsed, need_s):
        return True
    run.skipped.append(name)
    log.info("deadline_s %.0f: skipping the %s (about %.0f s, %.0f s left); to get it: %s", cfg.deadline_s, name,
             need_s, max(cfg.deadline_s - elapsed, 0), hint)
    return False


def format_sampled(sampled: dict) -> str:
    """One line per condition: mean@n and pass@n of the sampled pass."""
    any_row = next(iter(sampled.values()))
    head = (f"sampled (T {any_row['temperature']:g}, n {any_row['n']}, first {any_row['n_problems']} held-out problems, "
            f"common seeds):")
    return "\n".join([head] + [f"  {name:<6} mean@{r['n']} {r['mean_at_n']:.3f}   pass@{r['n']} {r['pass_at_n']:.3f}"
                                for name, r in sampled.items()])


def _export_adapters(run: TrainRun, final_step: int) -> dict[str, AdapterRef | None]:
    """Write ``adapters/mean`` and ``adapters/best`` (PEFT) and return the final call's conditions: the
    SFT warm start first (``eval.baselines``: bf16 greedy decoding drifts by up to ~1.6 points between
    engine calls, which would bias the paired test against step 0), then the exports."""
    from engine.lora.files import write_adapter

    cfg = run.cfg
    conds: dict[str, AdapterRef | None] = {"sft": sft_adapter_ref(run.sft_dir)} if cfg.eval.baselines else {}
    exports = {"mean": run.strategy.checked_mean()}
    if run.state.best_genome is not None:
        exports["best"] = run.state.best_genome
    for name, genome in exports.items():
        path = write_adapter(run.run_dir / "adapters" / name, run.codec.decode(genome), cfg.lora.rank,
                             cfg.lora.alpha, run.model_path, tuple(cfg.lora.target_modules))
        conds[name] = AdapterRef(f"final-{name}", lora_int_id(final_step, run.P + len(conds)), str(path))
    return conds


def _report_interrupt(progress: _Progress, exc: BaseException) -> None:
    """Close the evaluator and its engine, then print the interrupted run's one line on stderr (resume
    hint, or nothing to resume): last, after whatever vLLM's engine processes print as they stop."""
    _close_evaluator(progress)
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
