"""``essa train``'s command function, and training in rounds (``rounds.count`` > 1; issue 39).

A round is one ordinary ``essa train`` run (engine/commands/train.py) in ``<run dir>/round_<r>``: the
genome is built over the round's warm start, the strategy searches for ``generations`` generations, and
the final call scores the round's warm start and mean on the held-out problems. Between rounds, the
*fold* distils the round's correct completions into the round's mean adapter by SFT
(``<run dir>/fold_<r>``, engine/lora/sft.py::fold), and that adapter is the next round's warm start
(``sft.adapter``), decomposed afresh: Iterative RandOpt's perturb-select-fold in rounds
(../shared/notes/es-levers-2.md). ``rounds.control=true`` is the control that isolates evolution's
share: the same rounds and folds, every generation sampling only the round's warm start (rejection-
sampling fine-tuning without a population).

Resume: ``essa train rounds.count=R resume=<run dir>`` skips finished rounds (their ``summary.json``)
and folds (their adapter; written atomically), resumes an interrupted round from its checkpoint, and
starts the rest. ``rounds.json`` records each round as it finishes (written atomically).
"""
from __future__ import annotations

import copy
import json
import logging
import sys
from pathlib import Path

from omegaconf import OmegaConf

from engine import io
from engine.commands.train_config import ROUND_SEED_STRIDE, validate
from engine.config import ConfigError

log = logging.getLogger("essa")


def run(cfg, run_dir) -> float | None:
    """``essa train``'s command function: one run (:func:`engine.commands.train.run_train`) or, with
    ``rounds.count`` > 1, :func:`run_rounds`; returns the final mean genome's held-out accuracy (what a
    Hydra sweeper maximises), None when there was no final validation.

    Raises:
        ConfigError: ``strategy.name=`` / ``strategy._target_=`` picked a class that rejects the options
            of the ``strategy=`` group option under it (one line naming the override that fixes it).
    """
    from hydra.core.hydra_config import HydraConfig

    from engine.commands.train import run_train
    from engine.search.plugins import check_strategy_choice

    check_strategy_choice(cfg.strategy, cfg.seed, HydraConfig.get().runtime.choices.get("strategy"))
    if cfg.rounds.count > 1:
        return run_rounds(cfg, run_dir, run_train)["rounds"][-1]["val"].get("mean")
    return run_train(cfg, run_dir)["val"].get("mean")


def rounds_dir(cfg, run_dir: str | Path) -> Path:
    """The rounds' directory: Hydra's run dir, or ``resume``'s (which must hold ``rounds.json``, written when
    the rounds start).

    Raises:
        ConfigError: ``resume`` names a directory that is not a run in rounds.
    """
    if not cfg.resume:
        return Path(run_dir)
    path = Path(cfg.resume).expanduser()
    if not path.is_dir():
        raise ConfigError(f"resume={cfg.resume}: no such directory; give the run directory that "
                          f"`essa train rounds.count={cfg.rounds.count}` printed")
    if not (path / "rounds.json").is_file():
        raise ConfigError(f"resume={cfg.resume}: no rounds.json there, so not a run in rounds; give the directory "
                          f"`essa train rounds.count={cfg.rounds.count}` made, or resume a single run with rounds.count=1")
    return path


def rounds_config(cfg) -> dict:
    """The fields a run in rounds depends on: every checkpoint's (RESUME_KEYS), ``generations`` and ``rounds``;
    a resume must match them."""
    from engine.commands.train_checkpoint import resume_config

    return {**resume_config(cfg), "generations": cfg.generations,
            "rounds": OmegaConf.to_container(cfg.rounds, resolve=True)}


def open_rounds(cfg, root: Path) -> dict:
    """The record of the rounds in ``root``: a new one (written now, so that a stop in round 0 can resume), or
    the one a resume continues, checked against ``cfg``.

    Raises:
        ConfigError: a resume whose config differs (the first fields named, with the values to use).
    """
    from engine.commands.train_checkpoint import config_diff

    new = {"config": rounds_config(cfg), "rounds": []}
    if not cfg.resume:
        io.write_json(root / "rounds.json", new)
        return new
    old = io.read_json(root / "rounds.json")
    diff = config_diff(old.get("config", {}), new["config"])
    if diff:
        shown = " ".join(f"{k}={json.dumps(a)}" for k, a, _ in diff[:5])
        raise ConfigError(f"resume={root}: the config differs from the rounds' in {len(diff)} field(s); resume with "
                          f"their values ({shown}) or start a new run without resume")
    return old


def round_config(cfg, r: int, start: Path | None, round_dir: Path):
    """The config of round ``r``: one ordinary run (``rounds.count=1``) seeded ``seed + r * 1000``, starting
    from ``start`` (``sft.adapter``; None: round 0's own warm start), resumed from ``round_dir``'s checkpoint
    when there is one. The control samples copies of the warm start (``rollout.placebo``) at
    ``rounds.control_temperature`` with independent seeds."""
    rc = copy.deepcopy(cfg)
    OmegaConf.set_readonly(rc, False)
    rc.rounds.count, rc.rounds.control = 1, False
    rc.seed = cfg.seed + r * ROUND_SEED_STRIDE
    rc.sft.adapter = str(start) if start is not None else cfg.sft.adapter
    rc.resume = str(round_dir) if (round_dir / "checkpoint.pkl").is_file() else None
    if cfg.rounds.control:
        rc.rollout.placebo, rc.rollout.common_seeds = True, False
        rc.rollout.temperature = cfg.rounds.control_temperature
    return rc


def fold_rows(rollouts: list[dict], problems: dict, max_rows: int, seed: int) -> list:
    """The fold's training rows: the distinct correct completions of a round's rollouts, as problems whose
    ``solution`` is the completion. One completion per problem first (its most frequent correct text), in
    a seeded random order of problems, then second completions, and so on, up to ``max_rows``.

    Args:
        rollouts: rows of the round's ``rollouts/gen_*.parquet`` (``prompt_id``, ``completion``, ``status``).
        problems: ``{problem id: engine.tasks.Problem}`` of the task's train split.

    Raises:
        KeyError: a rollout names a problem the task does not have (the task changed under the run).
    """
    import dataclasses
    from collections import Counter

    import numpy as np

    counts: dict[str, Counter] = {}
    for row in rollouts:
        if row["status"] == "correct" and row["completion"].strip():
            counts.setdefault(row["prompt_id"], Counter())[row["completion"]] += 1
    ids = sorted(counts)
    order = [ids[i] for i in np.random.default_rng(seed).permutation(len(ids))]
    ranked = {pid: [text for text, _ in counts[pid].most_common()] for pid in order}
    rows = []
    for depth in range(max((len(v) for v in ranked.values()), default=0)):
        for pid in order:
            if depth < len(ranked[pid]) and len(rows) < max_rows:
                rows.append(dataclasses.replace(problems[pid], solution=ranked[pid][depth]))
    return rows


def read_rollouts(round_dir: Path) -> list[dict]:
    """Every rollout row of a finished round (``rollouts/gen_*.parquet``, generation order)."""
    import pyarrow.parquet as pq

    files = sorted((round_dir / "rollouts").glob("gen_*.parquet"))
    return [row for f in files for row in pq.read_table(f, columns=["prompt_id", "completion", "status"]).to_pylist()]


def fold_round(cfg, r: int, round_dir: Path, out: Path) -> dict:
    """Fold round ``r``: its correct completions (:func:`fold_rows`) distilled into its mean adapter
    (``round_dir/adapters/mean``) by SFT into ``out`` (a finished ``out`` is kept as it is). Returns its record
    for rounds.json (rows, steps, last loss).

    Raises:
        ValueError: the round produced no correct completion (nothing to fold).
    """
    from engine.hardware import resolve_dtype
    from engine.lora.sft import fold
    from engine.model import resolve_model_path
    from engine.tasks import load_task

    if not (out / "adapter_config.json").is_file():  # a finished fold is kept as it is
        task = load_task(cfg.task)
        rows = fold_rows(read_rollouts(round_dir), {p.id: p for p in task.train}, cfg.rounds.max_rows,
                         cfg.seed + r * ROUND_SEED_STRIDE)
        if not rows:
            raise ValueError(f"round {r} ({round_dir}) produced no correct completion to fold; start a new run with "
                             "a stronger warm start (sft.max_steps) or more generations per round")
        steps = cfg.rounds.fold_steps or -(-len(rows) // cfg.sft.batch_size)
        dtype, _ = resolve_dtype(cfg.model.dtype, purpose="training", log_choice=False)
        fold(resolve_model_path(cfg.model.path), round_dir / "adapters" / "mean", rows, cfg.sft,
             cfg.task.system_prompt, out, steps, cfg.rounds.fold_lr or cfg.sft.lr, dtype)
    meta = io.read_json(out / "sft_meta.json")
    return {"rows": meta.get("examples"), "steps": meta.get("steps"), "last_loss": meta.get("last_loss")}


def run_rounds(cfg, run_dir: str | Path, run_train) -> dict:
    """Train in ``rounds.count`` rounds (module docstring): round, fold, round, ..., round.

    Args:
        cfg: the composed ``essa train`` config (``rounds.count`` > 1).
        run_dir: Hydra's run directory (``resume`` names another: the rounds' own, to continue).
        run_train: :func:`engine.commands.train.run_train` (one round; a fake in unit tests).

    Returns:
        ``{"config", "rounds": [{"round", "dir", "val", "paired_vs_sft", "fold"?}, ...], "run_dir"}``, also in
        ``<run dir>/rounds.json``.

    Raises:
        ConfigError / ValueError: bad configuration (one line), a round with nothing to fold.
        KeyboardInterrupt: Ctrl-C; finished rounds and folds are kept, ``resume=<run dir>`` continues.
    """
    from engine.commands.train import continue_log_in

    validate(cfg)  # the rounds' own checks; each round's run checks its one-run config again
    root = rounds_dir(cfg, run_dir)
    root.mkdir(parents=True, exist_ok=True)
    io.remove_stale_temp_dirs(root)  # a fold killed outright (SIGKILL)
    record = open_rounds(cfg, root)
    if cfg.resume:
        continue_log_in(root)
    try:
        for r in range(len(record["rounds"]), cfg.rounds.count):
            record["rounds"].append(one_round(cfg, r, root, run_train))
            io.write_json(root / "rounds.json", record)
    except KeyboardInterrupt:
        print(f"rounds: interrupted in round {len(record['rounds'])}; continue the rounds with: essa train "
              f"resume={root} <same overrides> (the rounds' directory, not a round_<r> inside it; finished rounds "
              "and folds are kept)", file=sys.stderr)
        raise
    print(rounds_table(record))
    return {**record, "run_dir": str(root)}


def one_round(cfg, r: int, root: Path, run_train) -> dict:
    """Round ``r`` (run, or resumed, or read back when finished) and, unless it is the last, its fold."""
    start = root / f"fold_{r - 1}" if r else None
    round_dir = root / f"round_{r}"
    log.info("round %d of %d (%s) in %s", r + 1, cfg.rounds.count,
             "control: copies of the warm start" if cfg.rounds.control else "evolution", round_dir)
    entry = {"round": r, "dir": str(round_dir), **finished_round(round_dir, run_train, round_config(cfg, r, start, round_dir))}
    if r + 1 < cfg.rounds.count:
        entry["fold"] = fold_round(cfg, r, round_dir, root / f"fold_{r}")
    return entry


def finished_round(round_dir: Path, run_train, cfg_r) -> dict:
    """Round results from its ``summary.json`` if it finished before, else after running (or resuming) it."""
    summary = round_dir / "summary.json"
    if not summary.is_file():
        run_train(cfg_r, round_dir)
    s = io.read_json(summary)
    return {"val": s.get("val", {}), "paired_vs_sft": s.get("paired_vs_sft")}


def rounds_table(record: dict) -> str:
    """The rounds in words: each round's warm start and mean held-out accuracy, and its fold's rows."""
    control = record["config"]["rounds"]["control"]
    lines = [f"rounds ({'control: no evolution' if control else 'evolution'}):",
             "round  start   mean    fold rows"]
    for e in record["rounds"]:
        v = e["val"]
        rows = e.get("fold", {}).get("rows", "-")
        lines.append(f"{e['round']:>5}  {v.get('sft', float('nan')):.3f}   {v.get('mean', float('nan')):.3f}   {rows}")
    return "\n".join(lines)
