"""Ask/tell search strategies, genome codecs and the strategy plugin registry.

A strategy is found by :func:`get_strategy` in this order:

1. a built-in name in :data:`REGISTRY`;
2. an entry point of group ``essa.strategies`` (a third-party package declares
   ``[project.entry-points."essa.strategies"] my_name = "my_pkg.module:MyStrategy"``);
3. a dotted import path ``"my_pkg.module.MyStrategy"``.

Built-ins: ``cma_es`` (pycma CMA-ES, full covariance up to D = 2000), ``essa`` (the same
class: ESSA, arXiv 2507.04453, is CMA-ES over the SVD-LoRA genome, which is chosen by
``strategy.genome.kind``), ``sep_cma`` (separable/diagonal CMA-ES), ``lra_cma`` (CMA-ES with
learning-rate adaptation, arXiv 2304.03473, through ``cmaes``; D <= 2000), ``openai_es``
(OpenAI-ES, arXiv 1703.03864: mirrored sampling, centred ranks, fixed sigma, SGD or Adam),
``randopt`` (RandOpt-style top-K averaging), ``mezo_gv`` (MeZO-GV-style best-minus-worst direction),
``corp`` (CoRP-style compatibility-weighted direction behind a held-out gate),
``guided_cma`` (CMA-ES with a ridge-regression direction injected every generation), ``nevergrad``
(Nevergrad's ask/tell optimizers, ``strategy.options.optimizer``), and the skeptic's baselines
``random_baseline`` (random search) and ``scale_baseline`` (a 1-D search over the warm start's scale,
strategies/baselines.py).

A plugin author checks a strategy against the contract with :mod:`strategies.testing`
(``check_strategy(MyStrategy)`` in the plugin's own pytest).
"""

from __future__ import annotations

import importlib
import importlib.metadata

from strategies.base import Strategy, rank_nan_last
from strategies.baselines import RandomSearch, ScaleSearch
from strategies.cma_es import CMAES, SepCMAES
from strategies.corp import CoRP
from strategies.guided_cma import GuidedCMAES
from strategies.lra_cma import LRACMAES
from strategies.mezo_gv import MeZOGV
from strategies.nevergrad_bridge import NevergradStrategy
from strategies.openai_es import OpenAIES
from strategies.randopt import RandOpt

__all__ = ["REGISTRY", "ENTRY_POINT_GROUP", "Strategy", "get_strategy", "plugin_entry_points", "rank_nan_last"]

ENTRY_POINT_GROUP = "essa.strategies"

REGISTRY: dict[str, type[Strategy]] = {
    "cma_es": CMAES,
    "essa": CMAES,
    "sep_cma": SepCMAES,
    "lra_cma": LRACMAES,
    "openai_es": OpenAIES,
    "randopt": RandOpt,
    "mezo_gv": MeZOGV,
    "corp": CoRP,
    "guided_cma": GuidedCMAES,
    "nevergrad": NevergradStrategy,
    "random_baseline": RandomSearch,
    "scale_baseline": ScaleSearch,
}


def plugin_entry_points() -> list[importlib.metadata.EntryPoint]:
    """The installed ``essa.strategies`` entry points (not loaded), sorted by name.

    A plugin class may carry a class attribute ``config``: a dict of the ``strategy`` config
    fields (``population_size``, ``sigma0``, ``options``, ``genome``) that essa's CLI stores as the
    Hydra group option ``strategy=<entry-point name>`` (engine/search/plugins.py).
    """
    return sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def _check(obj: object, where: str) -> type[Strategy]:
    if not (isinstance(obj, type) and issubclass(obj, Strategy)):
        raise ValueError(f"strategy {where} resolves to {obj!r}, which is not a subclass of strategies.Strategy")
    return obj


def _one_line(err: BaseException) -> str:
    """``"<Type>: <message>"`` on one line (newlines folded into " / "), or the type alone without a message."""
    text = " / ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def get_strategy(name_or_target: str, field: str | None = None) -> type[Strategy]:
    """Resolve a strategy class by registry name, entry point, or dotted path.

    Args:
        name_or_target: ``"cma_es"``, an ``essa.strategies`` entry-point name, or
            ``"pkg.module.Class"``.
        field: the config field that named it (``"strategy.name"``, ``"strategy._target_"``);
            error messages start with ``<field>=<value>``.

    Returns:
        The :class:`Strategy` subclass (not an instance).

    Raises:
        ValueError: if nothing matches (one line naming the field and value, listing the built-in
            names and the installed plugins, and how to register a plugin) or the match is not a
            Strategy subclass, or an installed plugin's entry point does not import (any exception or
            ``SystemExit`` from its import, named with the entry point), or a dotted path's module calls
            ``sys.exit`` on import. Other errors raised while importing a dotted path's module propagate
            unchanged.
    """
    where = f"{field}={name_or_target!r}" if field else f"strategy {name_or_target!r}"
    if name_or_target in REGISTRY:
        return REGISTRY[name_or_target]
    entry_points = plugin_entry_points()
    for ep in entry_points:
        if ep.name == name_or_target:
            try:
                loaded = ep.load()
            except (Exception, SystemExit) as err:  # noqa: BLE001 - whatever the plugin's import raises (sys.exit too)
                raise ValueError(f"{where}: the plugin's entry point {ep.value} does not load ({_one_line(err)}); "
                                 f"fix or reinstall the plugin package, or pick another strategy") from err
            return _check(loaded, f"entry point {ep.name!r} ({ep.value})")
    module_name, _, attr = name_or_target.rpartition(".")
    if module_name:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name is None or not (module_name == err.name or module_name.startswith(err.name + ".")):
                raise  # the plugin module exists but one of its own imports is missing
        except SystemExit as err:  # a module that exits on import would end the command silently, even with rc 0
            raise ValueError(f"{where}: importing module {module_name!r} called sys.exit ({_one_line(err)}); "
                             f"fix the module, or pick another strategy") from err
        else:
            if not hasattr(module, attr):
                raise ValueError(f"{where}: module {module_name!r} has no attribute {attr!r}; fix the dotted path "
                                 f"'pkg.module.Class'")
            return _check(getattr(module, attr), repr(name_or_target))
    plugins = sorted({ep.name for ep in entry_points} - set(REGISTRY))
    raise ValueError(
        f"{where} is not a known strategy; use one of: built-in {', '.join(sorted(REGISTRY))}; installed plugins "
        f"{', '.join(plugins) or '(none)'}; or a dotted path 'pkg.module.Class', or register a plugin under "
        f"entry-point group {ENTRY_POINT_GROUP!r}"
    )
