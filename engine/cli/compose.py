"""Composing a command's config the way ``@hydra.main`` will for the same command line.

Hydra's own pieces, in the order ``hydra._internal.utils._run_hydra`` (Hydra 1.3) uses them: its
argument parser; the search path of the task function (the primary config dir or ``--config-path``,
search-path plugins, ``--config-dir`` in front, ``hydra.searchpath`` from the config or the command
line); ``--config-name``; the run mode (``-m`` or ``hydra.mode=MULTIRUN``, Hydra 1.2+); and for a
sweep, every value of every swept key the way the basic sweeper splits them. So the check in front
of Hydra (engine/cli/overrides.py) accepts what Hydra composes and refuses what Hydra refuses.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any, Callable

# flags after which Hydra composes nothing from the overrides (or reads them its own way): left to Hydra
NOT_COMPOSING = ("-sc", "--shell-completion", "--hydra-help", "--version", "--experimental-rerun")


def parse_args(argv: list[str]) -> argparse.Namespace | None:
    """Hydra's reading of ``argv`` (``hydra._internal.utils.get_args_parser``), or None where Hydra composes
    nothing from the overrides (:data:`NOT_COMPOSING`, ``--info plugins``) or argparse refuses the line
    (Hydra's own usage message says why)."""
    from hydra._internal.utils import get_args_parser

    if any(a in NOT_COMPOSING or a.startswith(tuple(f"{f}=" for f in NOT_COMPOSING)) for a in argv):
        return None
    try:
        args = get_args_parser().parse_args(argv)
    except SystemExit:  # a bad flag: argparse has printed its usage line
        return None
    return None if args.info == "plugins" else args


def flag_error(args: argparse.Namespace) -> str | None:
    """Hydra's refusal of a combination of flags (raised as a traceback by ``_run_hydra``), else None."""
    if args.resolve and args.cfg is None and not args.help:
        return "--resolve: it only goes with --cfg or --help; add --cfg job"
    if args.run + (args.cfg is not None) + args.multirun + (args.info is not None) > 1:
        return "only one of --run, --multirun, --cfg and --info can be given; drop the others"
    return None


@dataclass
class Composer:
    """Composes configs with the search path and config name Hydra will use for one command line.

    Attributes:
        loader: Hydra's ``ConfigLoaderImpl`` over that search path.
        config_name: the primary config (``--config-name`` or the command's ``conf/<command>.yaml``).
        overrides: the command line's overrides.
        multirun: whether Hydra will sweep (``-m`` or ``hydra.mode=MULTIRUN``).
        shows: whether Hydra only shows the config (``--cfg``, ``--help``, ``--info``: always one run).
    """

    loader: Any
    config_name: str
    overrides: list[str]
    multirun: bool = False
    shows: bool = False
    _cache: dict = field(default_factory=dict)

    def compose(self, overrides: list[str] | None = None, config_name: str | None = None, mode=None):
        """The config Hydra composes for ``overrides`` (default: the command line's) in ``mode``
        (default RUN). Raises Hydra's or OmegaConf's exception where Hydra would."""
        from hydra.types import RunMode

        return self.loader.load_configuration(config_name=config_name or self.config_name,
                                              overrides=list(self.overrides if overrides is None else overrides),
                                              run_mode=mode or RunMode.RUN)

    def groups(self) -> dict[str, list[str]]:
        """Config groups on the search path (with the command line's ``hydra.searchpath``; Hydra's own
        ``hydra/...`` left out) -> their options."""
        from hydra.core.object_type import ObjectType

        if "groups" not in self._cache:
            hydra_overrides = [o for o in self.overrides if o.startswith("hydra.searchpath")]
            try:  # one repository for every group (the loader's get_group_options builds one per call)
                _, repo = self.loader._parse_overrides_and_create_caching_repo(self.config_name, hydra_overrides)
            except Exception:  # noqa: BLE001 - a bad hydra.searchpath: the primary config's search path
                _, repo = self.loader._parse_overrides_and_create_caching_repo(self.config_name, [])
            options = {g: sorted(repo.get_group_options(g, ObjectType.CONFIG))
                       for g in repo.get_group_options("", ObjectType.GROUP) if g != "hydra"}
            self._cache["groups"] = {g: o for g, o in options.items() if o}
        return self._cache["groups"]

    def configs(self) -> list:
        """What Hydra composes before any job runs: the config of a single run, or a sweep's master
        config then one job per value of each swept key (the others at their first value), the keys of
        ``hydra.sweeper.params`` (:func:`sweeper_params`) and of the command line alike. Raises where
        Hydra would."""
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.types import RunMode

        if not self.multirun or self.shows:
            return [self.compose()]
        master = self._cache.get("multirun") or self.compose(mode=RunMode.MULTIRUN)
        ConfigLoaderImpl.validate_sweep_overrides_legal(OverridesParser.create().parse_overrides(self.overrides),
                                                        run_mode=RunMode.MULTIRUN, from_shell=True)
        task = [o.input_line for o in OverridesParser.create().parse_overrides(self.overrides)
                if not o.is_hydra_override()]  # the sweeper sees the task's overrides; the master holds hydra's
        jobs = sweep_jobs(sweeper_params(master) + task)
        return [master] + [self.loader.load_sweep_config(master, job) for job in jobs]


def sweeper_params(cfg) -> list[str]:
    """The sweep a config sets in ``hydra.sweeper.params`` as override lines (``key=value``), the way the basic
    and Optuna sweepers put them before the command line's overrides (``BasicSweeper._parse_config``,
    ``OptunaSweeperImpl._parse_sweeper_params_config``, Hydra 1.3); [] without params."""
    from omegaconf import DictConfig, OmegaConf

    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None)
    return [f"{k}={v}" for k, v in params.items()] if isinstance(params, DictConfig) else []


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """Job override lists covering every value of every swept key once (the basic sweeper's split, made
    linear: the other keys at their first value); a continuous sweep (``interval``) by its start."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices: dict[str, list[str]] = {}
    parsed = OverridesParser.create().parse_overrides(overrides)
    for o in parsed:
        key = o.get_key_element()
        if not o.is_sweep_override():
            choices[key] = [f"{key}={o.get_value_element_as_str()}"]
        elif o.is_discrete_sweep():
            choices[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            choices[key] = [f"{key}={o.value().start}"]
    first = [v[0] for v in choices.values()]
    jobs = [first]
    for i, values in enumerate(choices.values()):
        jobs += [first[:i] + [v] + first[i + 1:] for v in values[1:]]
    return jobs if any(o.is_sweep_override() for o in parsed) else []


def composer_for(args: argparse.Namespace, config_name: str, task_function: Callable,
                 config_path: str) -> Composer:
    """The :class:`Composer` for Hydra's reading ``args`` of a command line of an ``@hydra.main(config_path,
    config_name)`` app whose task function is ``task_function``.

    Raises:
        hydra.errors.SearchPathException: ``--config-dir`` is not a directory (Hydra refuses it too).
    """
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import (create_automatic_config_search_path,
                                       detect_calling_file_or_module_from_task_function, detect_task_name)
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.utils import JobRuntime
    from hydra.errors import SearchPathException
    from hydra.types import RunMode

    calling_file, calling_module = detect_calling_file_or_module_from_task_function(task_function)
    search_path = create_automatic_config_search_path(calling_file, calling_module, args.config_path or config_path)
    if args.config_dir is not None:
        conf_dir = os.path.abspath(args.config_dir)
        if not os.path.isdir(conf_dir):
            raise SearchPathException(f"Additional config directory '{conf_dir}' not found")
        search_path.prepend(provider="command-line", path=f"file://{conf_dir}",
                            anchor=SearchPathQuery(provider="schema"))
    JobRuntime.instance().set("name", detect_task_name(calling_file, calling_module))
    c = Composer(ConfigLoaderImpl(config_search_path=search_path), args.config_name or config_name, args.overrides,
                 multirun=args.multirun, shows=bool(args.cfg or args.help or args.info))
    if c.multirun or c.shows:  # Hydra composes without asking the mode: -m sweeps, --cfg shows one run
        return c
    try:  # Hydra.get_mode: hydra.mode from the config composed for a multirun, sweeps not applied
        cfg = c.loader.load_configuration(config_name=c.config_name, overrides=list(args.overrides),
                                          run_mode=RunMode.MULTIRUN, validate_sweep_overrides=False)
    except Exception:  # noqa: BLE001 - composing fails again, with the error to report
        return c
    c.multirun = cfg.hydra.mode == RunMode.MULTIRUN
    if c.multirun:
        c._cache["multirun"] = cfg  # the sweep's master config (its sweeps are validated in configs())
    return c
