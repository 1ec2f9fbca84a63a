"""``essa lab``'s schema (conf/lab.yaml) and its checks. Light: no torch, no vLLM; strategies are imported only
by the checks that need the class (:func:`check_setting`, :func:`preview`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from engine.config import (ConfigError, LoggerConfig, LoRAConfig, SignalConfig, StrategyConfig, check_logger, check_signal,
                           check_strategy)

AGGREGATES = ("mean", "question_z")
LANDSCAPE_NAMES = ("minibatch", "likelihood", "sphere", "ellipsoid", "rastrigin")
"""engine.lab.landscapes.LANDSCAPES's keys (checked against it in tests/test_lab.py; not imported here)."""


@dataclass
class LandscapeConfig:
    """The landscape the strategies search (engine/lab/landscapes.py).

    name: minibatch (the simulator of essa's fitness) | likelihood (the real model and genome, fitness the
      log-likelihood of reference solutions through vLLM: minutes to start) | sphere | ellipsoid | rastrigin.
    dim: D, the genome length; null (the default) = the D essa train searches with ``strategy.genome``
      (minibatch: 240 per searched singular value, 240 at alpha 0.125, 1920 at alpha 1; likelihood: the
      codec's; engine/lab/genome.py). Another D is searched as asked, with a warning naming both.
    prompts: N problems per generation (minibatch). seed: the landscape's own seed: its problems, warm
      start and optimum (the run seed moves only the strategy and the minibatches, as in essa train).
    options: minibatch: knobs of the simulator (MinibatchParams fields, e.g. +landscape.options.chaos=0.4);
      likelihood: train (essa train overrides choosing model, task, warm start, engine), max_tokens,
      true_problems (engine/lab/landscapes.py LIKELIHOOD_OPTIONS).
    """

    name: str = "minibatch"
    dim: Optional[int] = None
    prompts: int = 64
    seed: int = 5
    options: Dict[str, Any] = field(default_factory=dict)


@dataclass
class LabConfig:
    """``essa lab``: strategy settings on a landscape, G generations, several seeds, one process.

    strategy: the ``strategy`` group (conf/strategy/*.yaml); its ``genome`` sets the D each setting searches,
      the run's (engine/lab/genome.py), unless ``landscape.dim`` is set.
    generations: G. seed / n_seeds: the run seeds are seed * n_seeds ... seed * n_seeds + n_seeds - 1
      (so the jobs of ``-m seed=0,1`` get disjoint blocks), unless ``seeds`` lists them.
    aggregate: rewards (P, N, 1) -> fitness: mean (ESSA) or question_z (EGGROLL's per-problem z-scores).
    compare: settings to run side by side, each a dict of overrides on this config
      (``compare=[{strategy.sigma0:0.1},{strategy:openai_es},{label:ties,strategy.options.ties:argsort}]``);
      setting 0 is the reference of the paired differences; empty = this config alone.
    label: the name of the base setting (default: the strategy's name). progress: show the tqdm bar.
    rollout: the dense reward and adaptive prompts, essa train's ``rollout`` levers (engine/config.py ``SignalConfig``).
    budget_evaluations: stop each seed before a generation that would take its candidate x problem evaluations
      (sum of P N) past this; null = all G generations. With generations set high, settings that spend
      differently (adaptive prompts) compare at equal evaluations (a real run's budget is its clock, and a
      generation's time grows with its P N).
    logger: an experiment tracker the config, the per-generation means, the summary and the figure also go to
      (``logger=tensorboard|mlflow|wandb``; engine/results/trackers.py).
    """

    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    landscape: LandscapeConfig = field(default_factory=LandscapeConfig)
    generations: int = 10
    seed: int = 0
    n_seeds: int = 5
    seeds: Optional[List[int]] = None
    aggregate: str = "mean"
    compare: List[Any] = field(default_factory=list)
    label: Optional[str] = None
    progress: bool = True
    rollout: SignalConfig = field(default_factory=SignalConfig)
    budget_evaluations: Optional[int] = None
    logger: LoggerConfig = field(default_factory=LoggerConfig)


SCHEMA = LabConfig


def register() -> None:
    """Store the schema as ``lab_schema`` (the head of conf/lab.yaml's defaults list), and a ``strategy=<name>``
    option for every installed strategy plugin (engine/search/plugins.py)."""
    from hydra.core.config_store import ConfigStore

    from engine.search.plugins import register_strategy_configs

    ConfigStore.instance().store(name="lab_schema", node=LabConfig)
    register_strategy_configs()


def run_seeds(cfg) -> list[int]:
    """The run seeds: ``seeds`` when given, else the block ``seed * n_seeds ...`` of ``n_seeds`` seeds."""
    if cfg.seeds is not None:
        return [int(s) for s in cfg.seeds]
    return [cfg.seed * cfg.n_seeds + i for i in range(cfg.n_seeds)]


def validate(cfg) -> None:
    """Checks of one composed :class:`LabConfig` (a setting), before anything runs.

    Raises:
        ConfigError: one line naming the field: strategy.population_size < 2, strategy.sigma0 not > 0,
            generations < 1, landscape.name unknown, landscape.dim < 1, landscape.prompts < 1, no
            seeds, a seed < 0, a seed listed twice, an unknown aggregate, compare not a list of dicts, a bad rollout field or
            budget_evaluations (:func:`check_rollout`).
    """
    check_strategy(cfg.strategy, LoRAConfig())
    if cfg.generations < 1:
        raise ConfigError(f"generations={cfg.generations}: must be >= 1 (the lab runs G generations), "
                          f"e.g. generations=10")
    land = cfg.landscape
    if land.name not in LANDSCAPE_NAMES:
        raise ConfigError(f"landscape.name={land.name!r} is not a landscape; use one of: {', '.join(LANDSCAPE_NAMES)}")
    if land.dim is not None and land.dim < 1:
        raise ConfigError(f"landscape.dim={land.dim}: must be >= 1 (the genome length D), e.g. landscape.dim=240")
    if land.prompts < 1:
        raise ConfigError(f"landscape.prompts={land.prompts}: must be >= 1 (problems per generation), "
                          f"e.g. landscape.prompts=64")
    if cfg.seeds is None and cfg.n_seeds < 1:
        raise ConfigError(f"n_seeds={cfg.n_seeds}: must be >= 1, or list the seeds: seeds=[0,1,2]")
    seeds = run_seeds(cfg)
    if not seeds or min(seeds) < 0:
        raise ConfigError(f"seeds={seeds}: must be a non-empty list of integers >= 0, e.g. seeds=[0,1,2]")
    if len(set(seeds)) < len(seeds):
        raise ConfigError(f"seeds={seeds}: must be distinct (a seed run twice is one replicate, not two), e.g. seeds=[0,1,2]")
    if cfg.aggregate not in AGGREGATES:
        raise ConfigError(f"aggregate={cfg.aggregate!r}: use mean (ESSA) or question_z (per-problem z-scores)")
    check_rollout(cfg)
    check_logger(cfg.logger)
    if not all(hasattr(c, "items") for c in cfg.compare):
        raise ConfigError("compare: must be a list of override dicts, "
                          "e.g. compare=[{strategy.sigma0:0.1},{strategy:openai_es}]")


def check_rollout(cfg) -> None:
    """Checks of the ``rollout`` fields (essa train's rules, engine/commands/train_config.py ``check_rollout``)
    and ``budget_evaluations``.

    Raises:
        ConfigError: one line naming the field.
    """
    check_signal(cfg.rollout, cfg.landscape.prompts, "landscape.prompts")
    first = cfg.strategy.population_size * cfg.landscape.prompts
    if cfg.budget_evaluations is not None and cfg.budget_evaluations < first:
        raise ConfigError(f"budget_evaluations={cfg.budget_evaluations}: below one generation's P N = {first}; "
                          f"raise it (e.g. budget_evaluations={10 * first}: 10 generations) or drop it")


def check_setting(cfg, choice: str | None):
    """Everything a setting can be refused for before a landscape is built, as ``essa train`` refuses it: the
    config, a strategy picked by ``strategy.name=`` over another option's options (``choice``: the
    ``strategy`` group option it was composed with), the class and its options, the genome the landscape
    cannot search. Returns ``(strategy class, landscape options dict, LabGenome)``.

    Raises:
        ConfigError / ValueError: one line naming the field and the fix.
    """
    from omegaconf import OmegaConf

    from engine.lab.genome import lab_genome
    from engine.search import check_strategy_options, strategy_class
    from engine.search.plugins import check_strategy_choice

    validate(cfg)
    s, land = cfg.strategy, cfg.landscape
    check_strategy_choice(s, int(cfg.seed), choice)
    cls = strategy_class(s)
    check_strategy_options(cls, s, int(cfg.seed))
    options = OmegaConf.to_container(land.options, resolve=True) if OmegaConf.is_config(land.options) \
        else dict(land.options)
    return cls, options, lab_genome(land, s.genome, options)


def preview(cfg, choice: str | None) -> None:
    """``essa lab --cfg job``'s checks (engine/cli/preview.py): :func:`check_setting` on the base setting, then the
    line the run logs: the strategy, the genome essa train would search and the D the lab searches (the
    warning where they differ).

    Raises:
        ConfigError / ValueError: the run's own one-line refusal.
    """
    import logging

    cls, _, genome = check_setting(cfg, choice)
    log = logging.getLogger("essa.lab")
    if genome.note:
        log.warning(genome.note)
    log.info(setting_line(cfg, cls, genome, genome.dim))


def setting_line(cfg, cls, genome, dim: int | None) -> str:
    """The line a lab setting logs at start: its strategy, the genome essa train would search with it (the
    ``LabGenome`` ``genome``) and the D the landscape searches (``dim``; None: the likelihood codec's)."""
    from engine.search import genome_text, strategy_text

    where = "the codec's D" if dim is None else f"D {dim}"
    return (f"{strategy_text(cfg.strategy, cls)}; {genome_text(cfg.strategy.genome, genome.run_dim or dim)} "
            f"({genome.model}); {cfg.landscape.name} landscape at {where}")
