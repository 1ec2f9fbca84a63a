"""Strategy plugins as Hydra config-group options.

A package that registers a strategy under the entry-point group ``essa.strategies``
(strategies/__init__.py) also gets a ``strategy`` group option of the same name, stored in Hydra's
ConfigStore before the config is composed, so ``essa train strategy=random_search`` selects the
plugin with its own population size, step size, options and genome instead of the options left
over from the default ``strategy: essa``. The option's values come from the class attribute
``config`` (a dict of :class:`engine.config.StrategyConfig` fields: ``population_size``,
``sigma0``, ``options``, ``genome``). One rule for the fields it leaves out, whatever command composes
the option (train, lab, ``--cfg job``): they come from the product's default strategy,
conf/strategy/essa.yaml (:data:`DEFAULT_STRATEGY`: P 16, sigma0 0.3, genome svd_lora alpha 0.125 mode
relative), key by key inside ``genome``; ``options`` are the class's own keyword arguments, so left out
they are ``{}``. A plugin that sets ``genome: {alpha: 0.5}`` thus searches the relative genome of
alpha 0.5 (D 960 at rank 8), not the schema's additive one.

Selecting a strategy by ``strategy.name=`` or ``strategy._target_=`` keeps the group option's
options; when the class rejects them, :func:`check_strategy_choice` names the override that fixes it.
"""
from __future__ import annotations

import inspect
import logging

from engine.config import CONF_DIR, ConfigError
from engine.search import build_error, check_strategy_options, strategy_class, strategy_options

log = logging.getLogger("essa")

CONF_STRATEGY_DIR = CONF_DIR / "strategy"
DEFAULT_STRATEGY = "essa"
"""The ``strategy=`` option whose config fills the fields a plugin's ``config`` leaves out (but ``options``)."""
STRATEGY_FIELDS = ("population_size", "sigma0", "options", "genome")
_WARNED: set[str] = set()  # "name=value" of plugins whose bad `config` was warned about (train and lab both register)


def register_strategy_configs() -> list[str]:
    """Store a ``strategy/<name>`` ConfigStore entry for every ``essa.strategies`` entry point that
    has no YAML file in conf/strategy/ (built-ins keep theirs).

    Returns:
        The names registered. Each entry is :func:`plugin_node` (the plugin's ``config`` over the default
        strategy's). A plugin whose module does not import still gets an entry (its import error then
        surfaces, with the fix, when it is selected: by the run, or ``--cfg job``); a ``config`` attribute
        that is not a dict of StrategyConfig fields is skipped with a warning naming the plugin.
    """
    from hydra.core.config_store import ConfigStore

    from strategies import plugin_entry_points

    cs = ConfigStore.instance()
    names = []
    for ep in plugin_entry_points():
        if (CONF_STRATEGY_DIR / f"{ep.name}.yaml").is_file():
            continue
        try:
            node = plugin_node(ep.name, _plugin_config(ep))
        except Exception as e:  # noqa: BLE001 - omegaconf's merge errors (a genome that is not a dict ...)
            log.warning("strategy plugin %s: `config` does not merge over strategy=%s's (%s); registered with "
                        "strategy=%s's fields", ep.name, DEFAULT_STRATEGY, e, DEFAULT_STRATEGY)
            node = plugin_node(ep.name, {})
        cs.store(group="strategy", name=ep.name, node=node, provider=f"essa.strategies:{ep.value}")
        names.append(ep.name)
    return names


def plugin_node(name: str, config: dict) -> dict:
    """The ``strategy=<name>`` group option of a plugin whose class sets ``config``: conf/strategy/essa.yaml
    (:data:`DEFAULT_STRATEGY`) with ``config`` merged over it (``genome`` key by key) and ``options`` only
    from ``config`` (module docstring)."""
    from omegaconf import OmegaConf

    default = OmegaConf.load(CONF_STRATEGY_DIR / f"{DEFAULT_STRATEGY}.yaml")
    default.options = {}
    merged = OmegaConf.merge(default, config, {"name": name})
    return OmegaConf.to_container(merged, resolve=True)


def _plugin_config(ep) -> dict:
    """The ``config`` dict of a plugin's class; {} (with one warning per process) when it is not a dict of
    StrategyConfig fields, and {} when the plugin does not import (its error surfaces when selected)."""
    try:
        extra = getattr(ep.load(), "config", None) or {}
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a broken plugin (even one calling sys.exit) must not break every command
        log.debug("strategy plugin %s (%s) does not import: %s", ep.name, ep.value, e)
        return {}
    if isinstance(extra, dict) and not set(extra) - set(STRATEGY_FIELDS):
        return extra
    if f"{ep.name}={ep.value}" not in _WARNED:
        _WARNED.add(f"{ep.name}={ep.value}")
        log.warning("strategy plugin %s: `config` must be a dict with keys among %s; got %r; registered "
                    "with the defaults of strategy=%s", ep.name, ", ".join(STRATEGY_FIELDS), extra,
                    DEFAULT_STRATEGY)
    return {}


def strategy_options_available() -> list[str]:
    """Every ``strategy=`` group option: conf/strategy/*.yaml plus ConfigStore entries."""
    from hydra.core.config_store import ConfigStore

    names = {p.stem for p in CONF_STRATEGY_DIR.glob("*.yaml")}
    repo = ConfigStore.instance().repo.get("strategy", {})
    names |= {k[:-5] for k in repo if k.endswith(".yaml")}
    return sorted(names)


def _group_option_for(cls, selected: str) -> str | None:
    """The ``strategy=`` option that selects ``cls``: the selected name itself, or the entry point
    whose target is the dotted ``_target_``."""
    from strategies import plugin_entry_points

    options = strategy_options_available()
    if selected in options:
        return selected
    for ep in plugin_entry_points():
        if ep.name in options and ep.value.replace(":", ".") == selected:
            return ep.name
    return None


def _rejected_keys(cls, options: dict) -> list[str]:
    """Option keys that ``cls.__init__`` has no parameter for (all keys when it takes ``**kwargs``)."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return list(options)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return list(options)
    return [k for k in options if k not in params] or list(options)


def check_strategy_choice(s, seed: int, choice: str | None) -> None:
    """Catch a strategy picked by ``strategy.name=`` / ``strategy._target_=`` on top of another
    group option whose ``strategy.options`` the picked class rejects (Hydra merges the override
    into the group option; ``'strategy.options={}'`` does not clear a dict).

    Args:
        s: the ``strategy`` group. seed: the run's seed.
        choice: the ``strategy`` group option Hydra chose (``hydra.runtime.choices.strategy``);
            None when unknown (nothing is checked).

    Raises:
        ConfigError: one line naming the exact override to use: ``strategy=<plugin>`` when the
            plugin has a group option, else ``~strategy.options.<key>`` for each leftover key.
        ValueError: the strategy name / target resolves to nothing (from ``get_strategy``).
    """
    selected = s._target_ or s.name
    options = strategy_options(s)
    if choice is None or not options or (not s._target_ and s.name == choice):
        return
    cls = strategy_class(s)
    rejected = build_error(cls, s, seed, options)
    if rejected is None:
        return  # the picked class takes the left-over options
    why, options_to_blame = rejected
    if not options_to_blame:  # it refuses something else (strategy.population_size): that field's line
        check_strategy_options(cls, s, seed)
    how = f"strategy._target_={s._target_}" if s._target_ else f"strategy.name={s.name}"
    option = _group_option_for(cls, selected)
    if option is not None:
        fix = f"select it with its own config: strategy={option} (instead of {how})"
    else:
        fix = "drop them: " + " ".join(f"~strategy.options.{k}" for k in _rejected_keys(cls, options))
    raise ConfigError(f"{how} keeps strategy.options={options} of strategy={choice}, which {cls.__name__} rejects "
                      f"({why}); {fix}")
