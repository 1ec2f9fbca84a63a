"""Capacity of the ESSA genome: how far can singular-value search move the model at all? (docs/results/genome-capacity.md)

The default run (``essa train``: 20-step SFT warm start, then CMA-ES over the top singular value
of every LoRA factor, D = 240) gains about +3 to +5 points held-out and then plateaus
(docs/results/evolution.md). Two explanations fit: the ES *signal and
budget* (16 candidates in D 240, noisy fitness on 64 greedy prompts, 10 generations), or the
*capacity* of the search space itself (one scale per factor on frozen singular vectors may
simply not reach a better model). This tool separates the two with a gradient oracle: it keeps
the genome exactly as ESSA searches it and replaces CMA-ES by gradient descent on the warm
start's own supervised loss. If the gradient optimum in the genome is not clearly better
held-out than the warm start, the genome, not the strategy, is the limit; if it is much better,
ES leaves reachable gain on the table.

What is kept exactly:

* the genome: the codec of ``strategy.genome`` built by ``make_genome`` from the cached SFT adapter, as
  ``essa train`` builds it (any kind: ``strategy.genome.kind=tinylora`` among the overrides gives
  TinyLoRA's). For the default :class:`strategies.genomes.SVDLoRAGenome` each factor A (r x in) and
  B (out x r) is SVD-decomposed separately; U and V stay frozen and only the top k = floor(alpha r)
  singular values move, s (1 + x) (``--mode relative``, the default run's) or s + x (``additive``).
  The torch path is the codec's own ``decode_torch`` (its float64-offsets / float32-products order),
  checked against ``codec.decode`` at x0 (must give the adapter back) and at the final x.
* the loss: the warm start's (engine/lora/sft.py ``_train``): the same rows (``sft_examples`` of the
  task's train split, the same system prompt and conversational prompt/completion format), prepared
  by TRL's ``SFTTrainer`` with the same ``max_length`` and ``completion_only_loss=True``, and the loss
  is ``SFTTrainer.compute_loss`` (mean token NLL on the completion).

What differs: only the genome x (D, float32) is trained, by Adam (constant ``--lr``), on batches of
``--batch-size`` rows drawn epoch by epoch (a fresh permutation of the SFT rows per epoch, seeded by
``--seed``). Each step the factors U diag(s') V^T are computed from x inside autograd and put into
the PEFT model's lora_A / lora_B modules in place of their weights; the base model is frozen.
Gradient checkpointing is off (it changes speed, not the loss).

Outputs in ``--out``:

* ``adapter/``: the PEFT adapter of the final x, ``engine.lora.files.write_adapter(codec.decode(x))``
  as ``essa train`` exports ``adapters/mean``, ready for ``essa eval``;
* ``capacity.json``: settings, D, per-step loss / gradient norm / max |x| / seconds, the loss on a
  fixed subset of the SFT rows and on train rows the SFT never saw, at x0 and at the final x, and
  the warm start's own loss record (``sft_meta.json``); rewritten atomically after every step;
* ``genome.npy``: the final x (float32, canonical codec order).

Usage (from the repo root; Hydra overrides of conf/train.yaml after the flags pick another run's
warm start, e.g. ``sft.max_steps=30``)::

    .venv/bin/python tools/genome_capacity.py --out outputs/capacity/rel_a0.125
    .venv/bin/python tools/genome_capacity.py --out outputs/capacity/rel_a1 --alpha 1
    .venv/bin/python tools/genome_capacity.py --out outputs/capacity/add --mode additive --lr 0.01
    .venv/bin/python tools/genome_capacity.py --out outputs/capacity/tiny16 strategy.genome.kind=tinylora
    .venv/bin/python tools/genome_capacity.py --steps 2 --batch-size 2 --eval-size 2 --out /tmp/cap  # smoke

Without ``--sft-dir`` the warm start is the one ``essa train`` (with the same overrides) would
use: composed from conf/train.yaml, found in ``$ESSA_CACHE/sft`` (trained there first when it is
not cached, as ``essa train`` would).

Evaluate against the warm start on the default run's validation (500 held-out problems, greedy,
96 new tokens) in one vLLM batch::

    essa eval adapters=[<out>/adapter,<sft_dir>] include_base=false max_tokens=96

(``<sft_dir>`` is printed at the start and stored in capacity.json; the conditions are named by
the directory names, ``adapter`` and the warm start's hash.)
"""
from __future__ import annotations

import argparse
import io as _io
import json
import logging
import math
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from engine import io
from engine.lora.files import read_adapter, write_adapter
from engine.lora.sft import sft_examples, sft_rows, warm_start

log = logging.getLogger("essa.capacity")


# --- config and warm start ---------------------------------------------------------------------

def compose_train_config(overrides: list[str]):
    """conf/train.yaml composed with Hydra's compose API, as ``essa train <overrides>`` sees it."""
    from hydra import compose, initialize_config_dir

    from engine.commands import register_configs
    from engine.commands.train_config import validate
    from engine.config import CONF_DIR

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides))
    validate(cfg)
    return cfg


def resolve_sft_dir(cfg, model_path: str, train) -> Path:
    """The warm start ``essa train`` uses with ``cfg`` (engine/commands/train.py): cached, or trained now."""
    from engine.hardware import resolve_dtype

    sft_dtype, _ = resolve_dtype(cfg.model.dtype, purpose="training", log_choice=False)
    return warm_start(model_path, train, cfg.sft, cfg.lora, cfg.task.system_prompt, dtype=sft_dtype)


# --- the genome ------------------------------------------------------------------------------

def build_codec(genome, lora: dict, alpha: float | None, mode: str | None):
    """The codec ``essa train`` builds from the ``strategy.genome`` group ``genome`` over ``lora``, with
    ``--alpha`` / ``--mode`` (svd_lora only) in place of the group's when given.

    Raises:
        SystemExit: ``--alpha`` or ``--mode`` with a genome kind that has neither.
    """
    from engine.search import genome_kwargs
    from strategies.genomes import make_genome

    kwargs = genome_kwargs(genome)
    if genome.kind != "svd_lora" and (alpha is not None or mode is not None):
        raise SystemExit(f"--alpha / --mode: strategy.genome.kind={genome.kind} has no alpha or mode; drop them")
    if alpha is not None:
        kwargs["alpha"] = alpha
    if mode is not None:
        kwargs["mode"] = mode
    return make_genome(genome.kind, lora, **kwargs)


def default_lr(codec) -> float:
    """Adam's lr in genome units: 0.05 for relative changes (svd_lora relative, tinylora); additive
    svd_lora 0.05 x the median searched singular value; the lora genome 0.05 x the median |entry|."""
    if getattr(codec, "mode", "relative") == "additive":
        return 0.05 * float(np.median(codec.s[:, : codec.k]))
    if hasattr(codec, "base"):
        return 0.05 * float(np.median(np.abs(codec.base)))
    return 0.05


def lora_module_name(key: str, adapter: str = "default") -> str:
    """PEFT state key -> module path in a loaded PeftModel (``...lora_A.weight`` -> ``...lora_A.default``)."""
    for f in ("A", "B"):
        suffix = f".lora_{f}.weight"
        if key.endswith(suffix):
            return key[: -len(suffix)] + f".lora_{f}.{adapter}"
    raise ValueError(f"not a LoRA factor key: {key!r}")


class FactorInjector:
    """Replaces the ``weight`` Parameters of the PEFT model's lora_A / lora_B modules by plain
    tensors, so each step's computed factors (carrying x's autograd graph) are what the forward uses."""

    def __init__(self, model, keys: list[str]) -> None:
        self.modules = {}
        for key in keys:
            mod = model.get_submodule(lora_module_name(key))
            w = mod.weight
            del mod.weight  # drop the Parameter; a plain tensor attribute takes its place
            mod.weight = w.detach()
            self.modules[key] = mod

    def original(self) -> dict[str, torch.Tensor]:
        return {k: m.weight.detach().clone() for k, m in self.modules.items()}

    def set(self, factors: dict[str, torch.Tensor]) -> None:
        for key, mod in self.modules.items():
            mod.weight = factors[key]


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(max |a - b| over all factors, max |a|)."""
    diff = max(float((a[k].detach().cpu().float() - b[k].detach().cpu().float()).abs().max()) for k in a)
    scale = max(float(a[k].detach().abs().max()) for k in a)
    return diff, scale


# --- the warm start's loss ---------------------------------------------------------------------

def build_trainer(model, tokenizer, rows: list[dict], sft_cfg, dtype: str, work_dir: Path):
    """An SFTTrainer set up like the warm start's (dataset preparation, collator, compute_loss);
    never trained, only used for its data pipeline and loss."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=str(work_dir), max_steps=1, per_device_train_batch_size=sft_cfg.batch_size,
        learning_rate=sft_cfg.lr, lr_scheduler_type="constant", warmup_steps=0, max_length=sft_cfg.max_length,
        save_strategy="no", report_to=[], seed=sft_cfg.seed, use_cpu=not torch.cuda.is_available(),
        bf16=dtype == "bfloat16", dataloader_num_workers=0, completion_only_loss=True,
        gradient_checkpointing=False, disable_tqdm=True,
    )
    return SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)


def prepared(trainer, rows: list[dict]) -> list[dict]:
    """Tokenized rows (input_ids, labels) of ``rows``, through the trainer's own preparation."""
    from datasets import Dataset

    ds = trainer._prepare_dataset(Dataset.from_list(rows), trainer.processing_class, trainer.args,
                                  False, None, "capacity")
    return [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in ds]


def batch_loss(trainer, model, examples: list[dict], device, autocast: bool) -> torch.Tensor:
    batch = {k: v.to(device) for k, v in trainer.data_collator(examples).items()}
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        return trainer.compute_loss(model, batch)


@torch.no_grad()
def mean_loss(trainer, model, examples: list[dict], batch_size: int, device, autocast: bool) -> float | None:
    """Token-weighted mean completion NLL over ``examples`` (None when empty)."""
    total, tokens = 0.0, 0
    for i in range(0, len(examples), batch_size):
        chunk = examples[i: i + batch_size]
        n = sum(sum(1 for t in e["labels"][1:] if t != -100) for e in chunk)
        total += float(batch_loss(trainer, model, chunk, device, autocast)) * n
        tokens += n
    return total / tokens if tokens else None


def batches(n: int, batch_size: int, steps: int, seed: int):
    """Row indices of each step: consecutive slices of a fresh permutation per epoch."""
    rng = np.random.default_rng(seed)
    order: list[int] = []
    for _ in range(steps):
        if len(order) < batch_size:
            order += rng.permutation(n).tolist()
        yield order[:batch_size]
        order = order[batch_size:]


# --- main ----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="tools/genome_capacity.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of conf/train.yaml (task, sft, lora, model)")
    ap.add_argument("--sft-dir", default=None, help="warm-start adapter dir (default: the one `essa train` uses)")
    ap.add_argument("--alpha", type=float, default=None,
                    help="genome alpha, k = floor(alpha r) (default strategy.genome.alpha: 0.125)")
    ap.add_argument("--mode", choices=("relative", "additive"), default=None,
                    help="genome mode (default strategy.genome.mode: relative)")
    ap.add_argument("--steps", type=int, default=40, help="Adam steps (default 40: 2 epochs of the 160 SFT rows)")
    ap.add_argument("--batch-size", type=int, default=8, help="rows per step (default 8, the warm start's)")
    ap.add_argument("--lr", type=float, default=None,
                    help="Adam lr in genome units (default 0.05 relative; additive: 0.05 x the median searched "
                         "singular value)")
    ap.add_argument("--eval-size", type=int, default=64,
                    help="rows of the SFT set and of unseen train rows whose loss is measured at x0 and at the "
                         "end (0 = skip)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="base model dtype (bfloat16: with autocast, as the warm start on a bf16 GPU)")
    ap.add_argument("--rows", type=int, default=0,
                    help="train on the first N train rows with a solution (0: the warm start's own rows; "
                         "480 with --steps 60: the data and steps of a 60-step warm start)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="output directory (adapter/, capacity.json, genome.npy)")
    args = ap.parse_args(argv)
    if args.steps < 0 or args.batch_size < 1 or args.eval_size < 0 or args.rows < 0:
        ap.error("--steps, --eval-size and --rows must be >= 0 and --batch-size >= 1")
    if args.alpha is not None and not 0 < args.alpha <= 1:
        ap.error(f"--alpha {args.alpha}: must be in (0, 1] (the searched fraction of each factor's singular values)")
    if args.sft_dir is not None and not (Path(args.sft_dir) / "adapter_config.json").is_file():
        ap.error(f"--sft-dir {args.sft_dir}: not a PEFT adapter directory (no adapter_config.json)")
    if Path(args.out).exists() and (not Path(args.out).is_dir() or any(Path(args.out).iterdir())):
        ap.error(f"--out {args.out}: exists and is not an empty directory; pass a new one (nothing is overwritten)")

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.hardware import detect_device
    from engine.model import resolve_model_path
    from engine.tasks import load_task
    t_start = time.perf_counter()
    cfg = compose_train_config(args.overrides)
    out = Path(args.out)
    torch.manual_seed(args.seed)

    model_path = resolve_model_path(cfg.model.path)
    task = load_task(cfg.task)
    sft_dir = Path(args.sft_dir) if args.sft_dir else resolve_sft_dir(cfg, model_path, task.train)
    log.info("warm start: %s", sft_dir)
    lora, acfg = read_adapter(sft_dir)
    if (acfg.get("r"), float(acfg.get("lora_alpha"))) != (cfg.lora.rank, float(cfg.lora.alpha)):
        log.warning("%s has r=%s lora_alpha=%s, the config lora.rank=%s lora.alpha=%s; using the adapter's",
                    sft_dir, acfg.get("r"), acfg.get("lora_alpha"), cfg.lora.rank, cfg.lora.alpha)
    codec = build_codec(cfg.strategy.genome, lora, args.alpha, args.mode)
    D = codec.dim
    lr = default_lr(codec) if args.lr is None else args.lr
    genome = {"kind": cfg.strategy.genome.kind, "D": D,
              **{k: getattr(codec, k) for k in ("alpha", "mode", "k", "u", "tied") if hasattr(codec, k)}}
    log.info("genome %s; Adam lr %g, %d steps x %d rows", genome, lr, args.steps, args.batch_size)

    # the rows: the warm start's, and (for a generalisation check) train rows it never saw
    examples = sft_examples(task.train, cfg.sft)
    if args.rows:  # the first N usable train rows: 480 = the data a 60-step warm start trains on
        examples = [p for p in task.train if p.solution][: args.rows]
    seen = {p.id for p in examples}
    unseen = [p for p in task.train if p.solution and p.id not in seen]

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, args.dtype))
    model = PeftModel.from_pretrained(base, str(sft_dir), is_trainable=False)
    model.requires_grad_(False)
    trainer = build_trainer(model, tokenizer, sft_rows(examples, cfg.task.system_prompt), cfg.sft, args.dtype,
                            out / ".trainer")
    model = trainer.model.eval()  # no dropout anywhere (lora_dropout 0); eval() also skips checkpointing
    device = next(model.parameters()).device
    autocast = args.dtype == "bfloat16"
    train_rows = [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in trainer.train_dataset]
    eval_seen = train_rows[: args.eval_size]
    eval_unseen = prepared(trainer, sft_rows(unseen[: args.eval_size], cfg.task.system_prompt)) if (
        args.eval_size and unseen) else []
    log.info("%d SFT rows (%d after preparation), %d + %d rows for the loss at x0 / end", len(examples),
             len(train_rows), len(eval_seen), len(eval_unseen))

    # differentiable decode; checks: x0 gives the adapter back, and the loss with injected factors
    # equals the loss of the PEFT model as loaded
    decode = codec.decode_torch
    injector = FactorInjector(model, codec.keys)
    loaded = injector.original()
    diff, scale = max_abs_diff(lora, loaded)
    assert diff <= 1e-6 * max(scale, 1.0), f"PEFT-loaded factors differ from read_adapter's by {diff}"
    x = torch.zeros(D, dtype=torch.float32, device=device, requires_grad=True)
    with torch.no_grad():
        at_x0 = decode(x)
    diff_x0, scale = max_abs_diff(at_x0, lora)
    assert diff_x0 <= 1e-5 * scale, f"torch decode(x0) differs from the SFT adapter by {diff_x0} (scale {scale})"
    probe = train_rows[: min(2, len(train_rows))]
    with torch.no_grad():
        loss_loaded = float(batch_loss(trainer, model, probe, device, autocast))
        injector.set(at_x0)
        loss_x0 = float(batch_loss(trainer, model, probe, device, autocast))
    assert abs(loss_loaded - loss_x0) <= 1e-3 * max(1.0, abs(loss_loaded)), (
        f"loss with injected x0 factors {loss_x0} != loaded adapter's {loss_loaded}")
    log.info("checks at x0: max |decode - adapter| %.2e (max |w| %.3g); probe loss %.5f loaded, %.5f injected",
             diff_x0, scale, loss_loaded, loss_x0)

    record = {
        "what": "gradient oracle over the ESSA genome (tools/genome_capacity.py)",
        "sft_dir": str(sft_dir), "model": model_path, "task": cfg.task.name,
        "sft_meta": _read_json(Path(sft_dir) / "sft_meta.json"),
        "overrides": list(args.overrides),
        "settings": {**genome, "rank": codec.rank, "steps": args.steps,
                     "batch_size": args.batch_size, "lr": lr, "optimizer": "Adam", "seed": args.seed,
                     "dtype": args.dtype, "device": str(device), "n_sft_rows": len(train_rows),
                     "eval_size": args.eval_size},
        "machine": {**detect_device().summary(), "torch_threads": torch.get_num_threads()},
        "checks": {"decode_x0_max_abs_diff": diff_x0, "probe_loss_loaded": loss_loaded,
                   "probe_loss_injected_x0": loss_x0},
        "steps": [],
    }
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if eval_seen:
        record["loss_x0"] = {"sft_rows": mean_loss(trainer, model, eval_seen, args.batch_size, device, autocast),
                             "unseen_rows": mean_loss(trainer, model, eval_unseen, args.batch_size, device, autocast)}
        log.info("loss at x0: SFT rows %.4f, unseen rows %s", record["loss_x0"]["sft_rows"],
                 _fmt(record["loss_x0"]["unseen_rows"]))
    record["eval_seconds_x0"] = time.perf_counter() - t0

    opt = torch.optim.Adam([x], lr=lr)
    t_train = time.perf_counter()
    for step, idx in enumerate(batches(len(train_rows), args.batch_size, args.steps, args.seed)):
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        injector.set(decode(x))
        loss = batch_loss(trainer, model, [train_rows[i] for i in idx], device, autocast)
        loss.backward()
        grad_norm = float(x.grad.norm())
        opt.step()
        row = {"step": step, "loss": float(loss.detach()), "grad_norm": grad_norm, "x_max_abs": float(x.detach().abs().max()),
               "x_norm": float(x.detach().norm()), "seconds": time.perf_counter() - t1}
        record["steps"].append(row)
        record["train_seconds"] = time.perf_counter() - t_train
        io.write_json(out / "capacity.json", record)
        log.info("step %d/%d  loss %.4f  |grad| %.3g  max|x| %.3f  %.1fs", step + 1, args.steps, row["loss"],
                 grad_norm, row["x_max_abs"], row["seconds"])

    # final x: the codec's decode must agree with the torch path; export like essa train's adapters/mean
    x_final = x.detach().cpu().numpy().astype(np.float32)
    with torch.no_grad():
        final = decode(x)
        injector.set(final)
    decoded = codec.decode(x_final.astype(np.float64))
    diff_end, scale = max_abs_diff(decoded, final)
    assert diff_end <= 1e-5 * scale, f"codec.decode(x) differs from the torch path by {diff_end} (scale {scale})"
    record["checks"]["decode_final_max_abs_diff"] = diff_end
    t0 = time.perf_counter()
    if eval_seen:
        record["loss_final"] = {"sft_rows": mean_loss(trainer, model, eval_seen, args.batch_size, device, autocast),
                                "unseen_rows": mean_loss(trainer, model, eval_unseen, args.batch_size, device,
                                                         autocast)}
        log.info("loss at the end: SFT rows %.4f (x0 %.4f), unseen rows %s (x0 %s)",
                 record["loss_final"]["sft_rows"], record["loss_x0"]["sft_rows"],
                 _fmt(record["loss_final"]["unseen_rows"]), _fmt(record["loss_x0"]["unseen_rows"]))
    record["eval_seconds_final"] = time.perf_counter() - t0
    record["genome"] = {"x_min": float(x_final.min()), "x_max": float(x_final.max()),
                        "x_mean": float(x_final.mean()), "x_std": float(x_final.std()),
                        "x_norm": float(np.linalg.norm(x_final))}
    if hasattr(codec, "singular_values"):
        s_new = codec.singular_values(x_final.astype(np.float64)[None])[0][:, : codec.k]
        record["genome"].update(s_ratio_A_median=_median_ratio(codec, s_new, "A"),
                                s_ratio_B_median=_median_ratio(codec, s_new, "B"))
    n_steps = len(record["steps"])
    record["seconds_per_step"] = record.get("train_seconds", 0.0) / n_steps if n_steps else None

    r_adapter, la = int(acfg.get("r", cfg.lora.rank)), float(acfg.get("lora_alpha", cfg.lora.alpha))
    targets = tuple(acfg.get("target_modules") or cfg.lora.target_modules)
    write_adapter(out / "adapter", decoded, r_adapter, la, model_path, targets)
    buf = _io.BytesIO()
    np.save(buf, x_final)
    io.atomic_write_bytes(out / "genome.npy", buf.getvalue())
    record["adapter"] = str(out / "adapter")
    record["seconds"] = time.perf_counter() - t_start
    record["eval_command"] = (f"essa eval adapters=[{out / 'adapter'},{sft_dir}] include_base=false max_tokens="
                              f"{cfg.eval.max_tokens}")
    io.write_json(out / "capacity.json", record)
    shutil.rmtree(out / ".trainer", ignore_errors=True)
    log.info("wrote %s and %s (%.0f s, %s s/step); evaluate with: %s", out / "adapter", out / "capacity.json",
             record["seconds"], _fmt(record["seconds_per_step"]), record["eval_command"])
    return record


def _median_ratio(codec, s_new: np.ndarray, factor: str) -> float | None:
    """Median over factors of kind A or B of s'/s (searched values with s > 0)."""
    rows = [i for i, k in enumerate(codec.keys) if k.endswith(f"lora_{factor}.weight")]
    s_ref = codec.s[rows, : codec.k]
    ok = s_ref > 0
    return float(np.median(s_new[rows][ok] / s_ref[ok])) if ok.any() else None


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _fmt(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"


if __name__ == "__main__":
    import sys

    from engine.config import ConfigError

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("\ntools/genome_capacity.py: interrupted; capacity.json holds the steps done so far (no adapter/)")
    except (ConfigError, ValueError, OSError) as e:
        sys.exit(f"tools/genome_capacity.py: error: {e}")
