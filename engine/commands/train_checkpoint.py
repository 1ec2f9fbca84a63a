"""``essa train``'s checkpoint: what a resumed run restores, and whether it may.

``checkpoint.pkl`` (written atomically after every generation) holds plain data only (version 2):
``{"version": 2, "config_key", "config" (the RESUME_KEYS fields), "run_state" (:class:`RunState` as a
dict), "strategy" (``Strategy.state_dict()``), "data_cursor"}``, so moving code never breaks a saved
run. Version 1 (until 2026-12) pickled ``RunState`` under its old class path ``engine.loop.RunState``;
:func:`read_checkpoint` still reads it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from engine import io

CHECKPOINT = "checkpoint.pkl"
CHECKPOINT_VERSION = 2
READABLE_VERSIONS = (1, 2)
RESUME_KEYS = ("model", "task", "lora", "sft", "strategy", "rollout", "reward", "seed")
"""Fields whose change makes a checkpoint meaningless for the resumed run."""


@dataclass
class RunState:
    """What a checkpoint restores besides the strategy: the last finished generation (-1 = none), the run
    clock (s), the best candidate so far (fitness, (D,) float64 genome, its generation) and the next
    generation's number of prompts. A field added later is absent from older checkpoints: it takes its
    default, which reproduces the older behaviour."""

    generation: int = -1
    wall_s: float = 0.0
    best_fitness: float = -np.inf
    best_genome: np.ndarray | None = None
    best_generation: int = -1
    prompts: int = 0  # the next generation's N under rollout.adaptive_prompts (0 = rollout.prompts_per_generation)
    skipped_steps: list[int] = dataclasses.field(default_factory=list)  # periodic validations deadline_s skipped


class _RunStateV1:
    """Stand-in for version 1's pickled ``engine.loop.RunState`` (its attributes arrive by ``__dict__``)."""


def resume_config(cfg) -> dict:
    """The config fields a checkpoint depends on (RESUME_KEYS), resolved to plain Python values
    (those ``cfg`` has: an old run's saved .hydra/config.yaml may lack some)."""
    return {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
            for k in RESUME_KEYS if k in cfg}


def config_key(cfg) -> str:
    """Hash of the config fields a checkpoint depends on (RESUME_KEYS)."""
    return hashlib.sha256(json.dumps(resume_config(cfg), sort_keys=True, default=str).encode()).hexdigest()[:16]


def write_checkpoint(run_dir: Path, cfg, state: RunState, strategy) -> None:
    """Write ``checkpoint.pkl`` (version 2, plain data) atomically."""
    io.write_pickle(run_dir / CHECKPOINT, {
        "version": CHECKPOINT_VERSION, "config_key": config_key(cfg), "config": resume_config(cfg),
        "run_state": dataclasses.asdict(state), "strategy": strategy.state_dict(), "data_cursor": state.generation + 1})


def read_checkpoint(run_dir: Path) -> dict:
    """The checkpoint of ``run_dir`` as written (version 1 or 2; ``run_state`` not yet checked).

    Raises:
        ValueError: no checkpoint, or an unreadable or foreign file (one line naming it and the fix).
    """
    path = run_dir / CHECKPOINT
    ckpt = io.read_pickle(path, classes={("engine.loop", "RunState"): _RunStateV1})
    version = ckpt.get("version") if isinstance(ckpt, dict) else "?"
    if version not in READABLE_VERSIONS:
        raise ValueError(f"resume: {path} has checkpoint version {version}, this essa reads versions "
                         f"{', '.join(map(str, READABLE_VERSIONS))}; resume it with the essa that wrote it, or start "
                         "afresh without resume")
    return ckpt


def checkpoint_state(ckpt: dict, run_dir: Path) -> RunState:
    """The checkpoint's :class:`RunState` (a dict in version 2, a pickled object in version 1).

    Raises:
        ValueError: no run state or no strategy state (one line naming the file and the fix).
    """
    state = ckpt.get("run_state")
    fields = vars(state) if isinstance(state, _RunStateV1) else state
    names = {f.name for f in dataclasses.fields(RunState)}
    if (not isinstance(fields, dict) or not set(fields) <= names or "generation" not in fields
            or not isinstance(ckpt.get("strategy"), dict)):
        raise ValueError(f"resume: {run_dir / CHECKPOINT} is incomplete (no run state or strategy state); "
                         "start afresh without resume")
    return RunState(**fields)


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
    """Whether ``field`` (dotted) has ``value`` as its schema default (TrainConfig): a field a newer
    version added, at the value that reproduces the older version's behaviour."""
    from engine.commands.train_config import TrainConfig
    try:
        default = OmegaConf.select(OmegaConf.structured(TrainConfig), field, throw_on_missing=True, default=_UNSET)
    except Exception:  # noqa: BLE001 - missing (???): no default
        return False
    if default is _UNSET:  # not in the schema (a plugin's field)
        return False
    default = OmegaConf.to_container(default, resolve=True) if OmegaConf.is_config(default) else default
    return json.dumps(default, sort_keys=True) == json.dumps(value, sort_keys=True, default=str)


def _show(v) -> str:
    return "<unset>" if v is _UNSET else json.dumps(v, default=str)


def resume_mismatch(ckpt: dict, cfg, run_dir: Path) -> str | None:
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
    if old and not diff:  # the same fields and values; the key was computed over fewer fields (an older version)
        return None
    if not diff:
        return (f"resume: the config differs from the checkpointed run in one of {RESUME_KEYS}; "
                f"resume with the same overrides as {run_dir}/.hydra/overrides.yaml")
    shown = "; ".join(f"{k}: {_show(a)} in the checkpoint, {_show(b)} now" for k, a, b in diff[:5])
    more = f"; and {len(diff) - 5} more" if len(diff) > 5 else ""
    fix = " ".join(f"{k}={_show(a)}" if a is not _UNSET else f"{k} at its default" for k, a, _ in diff[:5])
    return (f"resume: the config differs from the checkpointed run in {len(diff)} field(s) ({shown}{more}); "
            f"resume with the checkpoint's values{f' ({fix})' if fix else ''} (the run's own overrides: "
            f"{run_dir}/.hydra/overrides.yaml) or start a new run without resume")


def open_checkpoint(cfg) -> tuple[Path, dict, RunState]:
    """The run directory, checkpoint and run state that ``resume=<run dir>`` continues.

    Raises:
        ValueError: no readable checkpoint, a config that differs from the checkpointed run's, or a
            run that already finished every generation asked for (one line each, with the fix).
    """
    run_dir = Path(cfg.resume)
    ckpt = read_checkpoint(run_dir)
    mismatch = resume_mismatch(ckpt, cfg, run_dir)
    if mismatch:
        raise ValueError(mismatch)
    state = checkpoint_state(ckpt, run_dir)
    done = state.generation + 1
    if cfg.generations <= done and (run_dir / "summary.json").exists():
        # a finished run: resuming would only repeat the final validation and append duplicate rows
        raise ValueError(f"resume: {run_dir} already finished all {done} generations; raise "
                         f"generations={2 * done} (any value > {done}) to continue, or start a new run")
    return run_dir, ckpt, state


def restore_strategy(strategy, ckpt: dict, run_dir: Path) -> None:
    """Load the checkpoint's strategy state into ``strategy``.

    Raises:
        ValueError: the state does not load (a damaged or foreign checkpoint; one line).
    """
    try:
        strategy.load_state_dict(ckpt["strategy"])
    except Exception as e:  # noqa: BLE001 - a damaged or foreign checkpoint
        raise ValueError(f"resume: the strategy state in {run_dir / CHECKPOINT} does not load "
                         f"({type(e).__name__}: {e}); start afresh without resume") from None
