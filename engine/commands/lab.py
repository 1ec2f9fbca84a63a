"""``essa lab``: the strategy lab. Strategy settings on a landscape for G generations and several seeds, in
one process, in seconds; the same strategies, options and fitness aggregation as ``essa train``, with a
simulator (engine/lab/landscapes.py) in place of vLLM and the reward.

Several settings in one run: ``compare`` is a list of override dicts, each composed on top of this
run's config like a command line (a ``strategy: <option>`` entry selects a conf/strategy option, other
keys are dotted fields), so ``essa lab compare=[{strategy.sigma0:0.1},{strategy.sigma0:0.3}]`` runs
both settings on the same seeds; setting 0 is the reference of the paired differences. Hydra multirun
(``essa lab -m strategy=essa,openai_es seed=0,1``) runs one job per point instead, each with its own
run directory and table.

Outputs in the run directory (engine/lab/output.py): lab.parquet, lab_summary.json, lab_progress.png.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from engine.commands.lab_config import check_setting, run_seeds, setting_line, validate

log = logging.getLogger("essa.lab")

GROUPS = ("strategy",)
"""Config groups a ``compare`` entry may switch (``{strategy: openai_es}``)."""
RUN_KEYS = ("seed", "seeds", "n_seeds", "compare", "progress", "hydra")
"""Fields that belong to the whole run, not to one setting (refused inside ``compare``)."""
FREE_FORM = ("strategy.options.", "landscape.options.")
"""Free-form dict fields: a ``compare`` entry may add keys under them (the command line needs ``+``)."""


def _job_overrides() -> list[str]:
    """This job's command-line overrides (Hydra's task overrides), or [] outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _compose(overrides: list[str], name: str = "lab"):
    """conf/<name>.yaml composed with ``overrides`` (inside the running Hydra app, or a fresh one)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from engine.config import CONF_DIR

    if GlobalHydra.instance().is_initialized():
        return compose(config_name=name, overrides=overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def compose_setting(k: int, change: dict):
    """The config of ``compare[k]``: this job's overrides (less ``compare``) plus ``change``.

    Raises:
        ValueError: a run-wide key inside ``compare`` or a field the schema lacks (one line naming ``compare[k]``).
    """
    from omegaconf import OmegaConf, open_dict

    for key in change:
        if key.split(".")[0] in RUN_KEYS:
            raise ValueError(f"compare[{k}].{key}: belongs to the whole run (the settings share their seeds); "
                             f"set it outside compare")
    groups = {key: v for key, v in change.items() if key in GROUPS and isinstance(v, str)}
    base = [o for o in _job_overrides() if o.split("=")[0].lstrip("+~") not in ("compare", *groups)]
    try:
        cfg = _compose(base + [f"{key}={v}" for key, v in groups.items()])
    except Exception as e:  # noqa: BLE001 - Hydra's composition errors are several lines
        from engine.search.plugins import strategy_options_available

        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        options = ", ".join(strategy_options_available())
        raise ValueError(f"compare[{k}]: {first}; strategy options: {options}") from None
    for key, value in change.items():
        if key in groups:
            continue
        try:
            if key.startswith(FREE_FORM):
                with open_dict(cfg):
                    OmegaConf.update(cfg, key, value, merge=True)
            else:
                OmegaConf.update(cfg, key, value, merge=True)
        except Exception as e:  # noqa: BLE001 - omegaconf's key and type errors
            why = str(e).strip().splitlines()[0]
            raise ValueError(f"compare[{k}].{key}={value!r}: {why} (`essa lab --cfg job` prints every field)") from None
    return cfg


def job_strategy_choice() -> str | None:
    """The ``strategy`` group option this job was composed with (Hydra's runtime choices), or None outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.choices.get("strategy") if HydraConfig.initialized() else None


def setting_configs(cfg) -> list[tuple[str, dict, object, str | None]]:
    """(label, overrides, config, strategy group option) of every setting: ``compare``'s entries, or ``cfg``
    alone; the option is the entry's ``strategy:`` switch, else this job's (:func:`job_strategy_choice`)."""
    from omegaconf import OmegaConf

    base_label = cfg.label or str(cfg.strategy._target_ or cfg.strategy.name)
    if not cfg.compare:
        return [(base_label, {}, cfg, job_strategy_choice())]
    out = []
    for k, entry in enumerate(cfg.compare):
        change = OmegaConf.to_container(entry, resolve=True) if OmegaConf.is_config(entry) else dict(entry)
        label = change.pop("label", None) or ", ".join(f"{a}={json.dumps(b) if isinstance(b, (dict, list)) else b}"
                                                       for a, b in change.items()) or base_label
        switched = change.get("strategy") if isinstance(change.get("strategy"), str) else None
        out.append((str(label), change, compose_setting(k, change), switched or job_strategy_choice()))
    return out


def likelihood_context(cfg, options: dict) -> dict:
    """What the likelihood landscape needs beyond its options: essa train's model, task, lora, sft, engine and
    reward groups (conf/train.yaml with ``landscape.options.train``, a list of essa train overrides), this
    setting's ``strategy.genome`` and the adapters per engine call (P + the centre)."""
    from engine.backends import require_vllm
    from engine.commands.train_config import validate as validate_train

    require_vllm()  # the likelihood landscape starts an engine
    train = _compose([str(o) for o in options.get("train") or []], "train")
    validate_train(train)
    return {"groups": {k: train[k] for k in ("model", "task", "lora", "sft", "engine", "reward")},
            "genome": cfg.strategy.genome, "adapters": int(cfg.strategy.population_size) + 1}


def build_setting(label: str, change: dict, cfg, landscapes: dict, choice: str | None = None):
    """A runnable :class:`engine.lab.runner.Setting` from one setting's config (landscapes cached by config),
    searching the genome essa train would (engine/lab/genome.py); logs one line naming it, and the warning
    where the lab's genome is not the run's.

    Raises:
        ConfigError / ValueError: a bad field, strategy, option or landscape (one line naming it,
            :func:`check_setting`).
    """
    from omegaconf import OmegaConf

    from engine.lab.landscapes import make_landscape
    from engine.lab.runner import Setting
    from engine.search import strategy_options

    cls, options, genome = check_setting(cfg, choice)
    s, land = cfg.strategy, cfg.landscape
    if genome.note:
        log.warning(genome.note)
    real = land.name == "likelihood"  # the same engine serves settings of the same genome and P
    key = json.dumps([land.name, genome.dim, int(land.seed), int(land.prompts), options,
                      OmegaConf.to_container(s.genome) if real else None, int(s.population_size) if real else None],
                     sort_keys=True)
    if key not in landscapes:
        context = likelihood_context(cfg, options) if real else None
        landscapes[key] = make_landscape(land.name, genome.dim, int(land.seed), int(land.prompts), options, context)
    landscape = landscapes[key]
    log.info("setting %s: %s", label, setting_line(cfg, cls, genome, landscape.dim))
    budget = None if cfg.budget_evaluations is None else int(cfg.budget_evaluations)
    return Setting(label, str(s._target_ or s.name), cls, int(s.population_size), float(s.sigma0),
                   strategy_options(s), landscape, int(cfg.generations), str(cfg.aggregate), change,
                   float(s.get("mean_decay", 0.0)), lab_rollout(cfg, landscape), budget,
                   genome=genome.summary(landscape.dim))


def lab_rollout(cfg, landscape):
    """The setting's :class:`engine.lab.runner.Rollout` from ``cfg.rollout`` (essa train's field names) and
    ``landscape.prompts`` (essa train's ``rollout.prompts_per_generation``).

    Raises:
        ValueError: a lever the landscape cannot honour (one line naming the ``rollout`` field).
    """
    from engine.lab.runner import Rollout

    r = cfg.rollout
    if r.dense != "off" and not landscape.has_dense:
        raise ValueError(f"rollout.dense={r.dense}: the {landscape.name} landscape has no dense score; "
                         "use landscape.name=minibatch or rollout.dense=off")
    if r.adaptive_prompts and not landscape.variable_prompts:
        raise ValueError(f"rollout.adaptive_prompts=true: the {landscape.name} landscape has no minibatch to grow; "
                         "use landscape.name=minibatch or rollout.adaptive_prompts=false")
    return Rollout(prompts_per_generation=int(cfg.landscape.prompts), dense=str(r.dense),
                   dense_weight=float(r.dense_weight), adaptive_prompts=bool(r.adaptive_prompts),
                   noise_rho=float(r.noise_rho), max_prompts_per_generation=int(r.max_prompts_per_generation))


def _named(k: int, in_compare: bool, fn, *args):
    """``fn(*args)``; a bad setting's one-line error starts with ``compare[k]: `` when it came from ``compare``."""
    try:
        return fn(*args)
    except ValueError as e:  # ConfigError included; the type is kept
        if not in_compare or str(e).startswith(f"compare[{k}]"):
            raise
        raise type(e)(f"compare[{k}]: {e}") from None


def main(cfg, run_dir: str | Path) -> dict:
    """Run every setting on every seed, write the outputs, print the table. Returns the summary.

    Raises:
        ConfigError / ValueError: bad configuration (one line naming the field).
    """
    from engine.lab.landscapes import params_dict
    from engine.lab.output import format_table, write_outputs
    from engine.lab.runner import run_settings
    from engine.lab.summary import summarise
    from engine.lab.threads import one_blas_thread

    validate(cfg)
    seeds, landscapes = run_seeds(cfg), {}
    try:
        with one_blas_thread():
            settings = [_named(k, bool(cfg.compare), build_setting, label, change, c, landscapes, choice)
                        for k, (label, change, c, choice) in enumerate(setting_configs(cfg))]
            results, wall = run_settings(settings, seeds, progress=bool(cfg.progress))
            oracles = {id(land): land.oracle() for land in landscapes.values()}
    finally:
        for land in landscapes.values():
            land.close()
    summary = summarise(settings, results, seeds, [oracles[id(s.landscape)] for s in settings], wall)
    summary["landscape_params"] = [params_dict(s.landscape) for s in settings]
    rows = [row for per_seed in results for res in per_seed for row in res.rows]
    paths = write_outputs(run_dir, rows, summary)
    track(cfg, run_dir, rows, summary, paths)
    print(format_table(summary))
    print("\n" + "\n".join(f"{p.name}: {p}" for p in paths), flush=True)
    return summary


def track(cfg, run_dir, rows: list[dict], summary: dict, paths: list[Path]) -> None:
    """Send the run to the ``logger`` group's tracker (engine/results/trackers.py): the config, per generation
    each setting's mean over seeds of every numeric lab.parquet column (``<label>/<column>``), the summary
    and the figure."""
    import warnings

    import numpy as np
    from omegaconf import OmegaConf

    from engine.results.trackers import make_tracker

    if cfg.logger.name == "none":
        return
    tracker = make_tracker(cfg.logger, run_dir, OmegaConf.to_container(cfg, resolve=True), cfg.label)
    skip = ("setting", "seed", "generation")
    for g in sorted({r["generation"] for r in rows}):
        at = [r for r in rows if r["generation"] == g]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a column that is NaN for every seed stays NaN
            means = {f"{r0['label']}/{k}": float(np.nanmean([r[k] for r in at if r["setting"] == r0["setting"]]))
                     for r0 in at for k, v in r0.items() if k not in skip and isinstance(v, (int, float))}
        tracker.log_metrics(means, g)
    tracker.log_summary(summary)
    tracker.log_images({p.stem: p for p in paths if p.suffix == ".png"})
    tracker.close()


def run(cfg, run_dir) -> float | None:
    """``essa lab``'s command function: returns setting 0's mean held-out gain (minibatch) or its mean final
    true fitness (classic landscapes), the value a Hydra sweeper optimises."""
    from engine.lab.summary import sweep_value

    return sweep_value(main(cfg, run_dir))
