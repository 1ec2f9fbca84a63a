"""One-line messages for bad overrides, checked before Hydra runs (Hydra itself prints several lines
and exits 1): a misspelt field (with the nearest one), a ``+key`` the schema lacks, a config group the
command does not use, a composition error. Each names the override and the fix.

The check composes what Hydra will compose for the same command line (engine/cli/compose.py: the
same search path with ``--config-dir`` and ``hydra.searchpath``, the same config name, the same run
mode), so it refuses exactly what Hydra refuses; only the schema's check of ``+key`` additions
(:func:`unknown_keys`) is essa's own."""
from __future__ import annotations

import dataclasses
import os
import typing

from engine.commands import COMMANDS, hydra_commands
from engine.config import CONF_DIR, ConfigError

from .compose import Composer, composer_for, flag_error, parse_args


def unknown_keys(cfg, command: str) -> list[str]:
    """Dotted keys of a composed config that its schema does not have (``+key=...`` overrides get
    past Hydra's struct check). Free-form dict fields (``strategy.options``, ``engine.extra``) are
    not checked. Returns [] for commands without a schema."""
    from omegaconf import DictConfig

    schema = COMMANDS[command].schema()
    if schema is None:
        return []

    def walk(node, schema: type, prefix: str) -> list[str]:
        hints = typing.get_type_hints(schema)
        out = []
        for key in node.keys():
            if key == "hydra":
                continue
            if key not in hints:
                out.append(f"{prefix}{key}")
            elif dataclasses.is_dataclass(hints[key]) and isinstance(node._get_node(key), DictConfig):
                out += walk(node._get_node(key), hints[key], f"{prefix}{key}.")
        return out

    return walk(cfg, schema, "")


def hydra_error_line(e: BaseException, command: str = "train") -> str:
    """One line for a Hydra composition error of ``essa <command>``: the override, what is wrong, and the fix."""
    from hydra.errors import MissingConfigException, SearchPathException

    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    first = lines[0] if lines else type(e).__name__
    if isinstance(e, SearchPathException):
        return f"--config-dir: {first}; give an existing folder of config groups (e.g. -cd ./conf_user)"
    if isinstance(e, MissingConfigException) or first.startswith("In '") and "Could not find" in first:
        options = []
        if "Available options" in str(e):
            tail = str(e).split("Available options", 1)[1].split("Config search path", 1)[0]
            options = [ln.strip() for ln in tail.splitlines()[1:] if ln.strip()]
        what = first.split("Could not find", 1)[-1].strip(" '")
        return (f"no config '{what}'" + (f"; available: {', '.join(options)}" if options else "")
                + f" (conf/{what.rsplit('/', 1)[0]}/ and any --config-dir)")
    if first.startswith("Could not override"):
        key = first.split("'")[1] if "'" in first else first
        return f"{key}: no such field; check the spelling (`essa {command} --cfg job` prints every field)"
    if first.startswith("Could not append to config"):
        key = first.split("'")[1] if "'" in first else first
        return f"+{key}: {key} is already in the config; drop the '+' to change it, or write ++{key}=... to set it either way"
    if first.startswith("Error merging override") and e.__cause__ is not None:
        cause = str(e.__cause__).strip().splitlines()[0]
        return f"{first.split('override', 1)[1].strip()}: {cause}"
    if first.startswith("Ambiguous value"):
        return f"{first}: write a list as key=[a,b], quote a string as key='a,b', or add -m to sweep"
    if first.startswith("Sweep parameters"):
        return f"{first}; add -m (or hydra.mode=MULTIRUN) to sweep"
    return " ".join(ln for ln in lines if not ln.startswith(("See https://", "Set the environment")))


def config_groups(command: str) -> list[str]:
    """The config groups (folders of conf/) that ``conf/<command>.yaml``'s defaults list selects."""
    from omegaconf import OmegaConf

    defaults = OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"{COMMANDS[command].yaml}.yaml")).get("defaults") or []
    names = [k.split()[-1].split("@")[0] for d in defaults if isinstance(d, dict) for k in d]  # "optional x@pkg"
    return sorted(n for n in names if n != "hydra" and (CONF_DIR / n).is_dir())  # hydra: Hydra's own settings


def _compose_ok(composer: Composer, command: str, overrides: list[str]) -> bool:
    """Whether ``command``'s config composes on ``composer``'s search path with ``overrides`` and has no
    field its schema lacks."""
    try:
        return not unknown_keys(composer.compose(overrides, COMMANDS[command].yaml), command)
    except Exception:  # noqa: BLE001 - any failure means "does not accept"
        return False


def overlay_groups(command: str, composer: Composer) -> dict[str, list[str]]:
    """Overlay groups (on the search path, selected by no command's defaults list, e.g. ``experiment``)
    that ``command``'s config composes with (``+group=<first option>``) -> their options."""
    listed = {g for c in hydra_commands() for g in config_groups(c)}
    return {g: opts for g, opts in composer.groups().items()
            if g not in listed and config_groups(command) and _compose_ok(composer, command, [f"+{g}={opts[0]}"])}


def group_override_error(command: str, composer: Composer) -> str | None:
    """One line for an override that selects a config group ``command`` does not use, else None.

    ``essa eval +experiment=tiny``: the ``experiment`` group (conf/experiment/) overlays train's
    config only. A group counts as used by a command when its defaults list selects it, or (overlay
    groups such as ``experiment``, selected by no defaults list) when the command's config composes
    with the group's first option added. The line names the override, the commands that accept the
    group and the command's own groups.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    try:
        overrides = OverridesParser.create().parse_overrides(composer.overrides)
    except Exception:  # noqa: BLE001 - a malformed override: Hydra's own error says which
        return None
    listed = {c: config_groups(c) for c in hydra_commands()}
    groups = composer.groups()
    for o in overrides:
        group = o.key_or_group
        if group.startswith("hydra") or group not in groups or group in listed[command]:
            continue
        overlay = not any(group in g for g in listed.values())

        def accepts(c: str) -> bool:
            if not listed[c]:
                return False  # a command without config groups (bench) takes none
            return group in listed[c] or overlay and _compose_ok(composer, c, [f"+{group}={groups[group][0]}"])

        if accepts(command):
            if o.type == OverrideType.CHANGE:  # an overlay group is added, not changed
                return (f"override '{o.input_line}': config group '{group}' is an overlay that no defaults list "
                        f"selects; add it with '+': +{o.input_line}")
            continue
        others = [f"essa {c}" for c in hydra_commands() if c != command and accepts(c)]
        where = f" ({' and '.join(others)} {'accepts' if len(others) == 1 else 'accept'} it)" if others else ""
        own = (f"essa {command}'s groups: {', '.join(listed[command])}" if listed[command]
               else f"essa {command} takes no config groups")
        return (f"override '{o.input_line}': config group '{group}' does not apply to essa {command}{where}; "
                f"{own}; drop the override or run the command that takes it")
    return None


def field_paths(cfg, prefix: str = "") -> list[str]:
    """Dotted paths of every field of a composed config, nested ones included (``hydra`` left out)."""
    from omegaconf import DictConfig

    out = []
    for key in cfg.keys():
        if not prefix and key == "hydra":
            continue
        path = f"{prefix}{key}"
        out.append(path)
        node = cfg._get_node(key)
        if isinstance(node, DictConfig) and not node._is_none() and not node._is_missing():
            out += field_paths(node, f"{path}.")
    return out


def nearest_field(key: str, cfg) -> str | None:
    """The field of ``cfg`` whose dotted path is closest to ``key`` (difflib), other than ``key`` itself
    and its children; None when nothing is close."""
    import difflib

    paths = [p for p in field_paths(cfg) if p != key and not p.startswith(f"{key}.")]
    near = difflib.get_close_matches(key, paths, n=1, cutoff=0.6)
    return near[0] if near else None


def _is_open_dict(cfg, path: str) -> bool:
    """Whether ``path`` names a ``dict`` field of the schema (e.g. ``landscape.options``), whose keys are free."""
    from omegaconf import DictConfig, OmegaConf

    node = OmegaConf.select(cfg, path, default=None)
    if not isinstance(node, DictConfig):
        return False
    return node._metadata.object_type in (None, dict)


def strategy_option_line(key: str, cfg) -> str | None:
    """One line for a new key ``strategy.options.<name>`` the selected strategy class does not take: the
    class, the options it takes and the nearest one; None when the class takes it (then the '+' form
    works) or cannot be loaded."""
    import difflib

    from engine.search import class_options, strategy_class

    try:
        cls = strategy_class(cfg.strategy)
    except Exception:  # noqa: BLE001 - an unknown strategy: the run names it in its own line
        return None
    name, takes = key.rsplit(".", 1)[1], class_options(cls)
    if name in takes:
        return None
    near = difflib.get_close_matches(name, takes, n=1)
    return (f"{key}: strategy {cfg.strategy.name} ({cls.__name__}) takes no option '{name}'"
            + (f"; did you mean strategy.options.{near[0]}?" if near else "")
            + f" (its options: {', '.join(takes) or 'none'}; set one with +strategy.options.<option>=...)")


def no_such_field_line(command: str, key: str, cfg, value: str | None = None, added: bool = False) -> str:
    """One line for an override of a field ``cfg`` does not have: the key, the nearest field and the fix."""
    parent = key.rpartition(".")[0]
    if parent == "strategy.options" and "strategy" in cfg:
        line = strategy_option_line(key, cfg)
        if line:
            return line
    if not added and parent and _is_open_dict(cfg, parent):  # a free-form dict field: new keys need '+'
        return f"{key}: a new key of {parent}; add it with '+': +{key}{'' if value is None else f'={value}'}"
    near = nearest_field(key, cfg)
    fix = f"did you mean {near if value is None else f'{near}={value}'}?" if near else "check the spelling"
    how = " (added with '+'?)" if added else ""
    return f"{key}: no such field{how}; {fix} (`essa {command} --cfg job` prints every field)"


def _dict_override_line(command: str, o, cfg) -> str | None:
    """One line for ``key={...}`` merged into an existing dict field ``key`` that lacks one of the new keys."""
    import copy

    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    value = o.value()
    if o.is_sweep_override() or not isinstance(value, dict):
        return None
    try:
        OmegaConf.update(copy.deepcopy(cfg), o.key_or_group, value, merge=True)
    except (ConfigAttributeError, ConfigKeyError) as e:
        child = str(getattr(e, "full_key", "") or "")
        if not child.startswith(f"{o.key_or_group}."):
            return None
        if _is_open_dict(cfg, o.key_or_group):
            line = strategy_option_line(child, cfg) if o.key_or_group == "strategy.options" else None
            return line or (f"{o.input_line}: {child} is a new key of {o.key_or_group}; "
                            f"add new keys with '+': +{o.input_line}")
        return no_such_field_line(command, child, cfg)
    except Exception:  # noqa: BLE001 - the value itself is wrong: Hydra's line says why
        return None
    return None


def misspelt_key_error(command: str, composer: Composer) -> str | None:
    """One line for an override (``key=value``, no ``+``) of a field ``command``'s config lacks, else None.

    Checks single runs, sweeps (``-m``, every value of a sweep) and runs with Hydra flags (``--cfg job``)
    alike, on the config Hydra composes before the override applies, and names the nearest field
    (:func:`no_such_field_line`); a dict merged into an existing dict field names the new key.
    Group selections (``task=gsm8k``), ``hydra...`` keys, ``+``/``++``/``~`` overrides are left to Hydra.
    """
    import copy

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    try:
        overrides = OverridesParser.create().parse_overrides(composer.overrides)
    except Exception:  # noqa: BLE001 - a malformed override: Hydra's own error says which
        return None
    groups = composer.groups()

    def selects_group(o) -> bool:
        return o.key_or_group.startswith("hydra") or o.package is not None or o.key_or_group in groups

    plain = [o for o in overrides if not selects_group(o) and not (o.is_add() or o.is_force_add() or o.is_delete())]
    if not plain:
        return None
    # the config the plain overrides apply to: with the run's groups, hydra settings and '+' additions
    base = [o.input_line for o in overrides if not o.is_sweep_override()
            and (selects_group(o) or o.is_add() or o.is_force_add())]
    cfg = None
    for ovs in (base, [o for o in base if o.startswith("hydra.")], []):
        try:
            cfg = composer.compose(ovs)
            break
        except Exception:  # noqa: BLE001 - a bad group or addition: Hydra's own error says which
            continue
    if cfg is None:
        return None
    for o in plain:
        try:
            OmegaConf.update(copy.deepcopy(cfg), o.key_or_group, None, merge=True)
        except (ConfigAttributeError, ConfigKeyError):  # what Hydra reports as "Could not override"
            value = o.input_line.split("=", 1)[1] if "=" in o.input_line else None
            return no_such_field_line(command, o.key_or_group, cfg, value)
        except Exception:  # noqa: BLE001 - the field exists; its value is checked below or elsewhere
            pass
        line = _dict_override_line(command, o, cfg)
        if line:
            return line
    return None


def sweeper_params_line(composer: Composer) -> str | None:
    """One line for an override of ``hydra.sweeper.params`` (``hydra.sweeper.params.seed='0,1'``,
    ``hydra.sweeper.params={...}``) where the config's params are null, as essa's are: Hydra 1.3 cannot
    merge into that null (an AttributeError or AssertionError trace from OmegaConf); None otherwise."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    try:
        overrides = OverridesParser.create().parse_overrides(composer.overrides)
    except Exception:  # noqa: BLE001 - a malformed override: Hydra's own error says which
        return None
    hits = [o for o in overrides if o.key_or_group == "hydra.sweeper.params"
            or o.key_or_group.startswith("hydra.sweeper.params.")]
    if not hits:
        return None
    try:
        cfg = composer.compose([o.input_line for o in overrides if o.is_hydra_override() and o not in hits],
                               mode=RunMode.MULTIRUN)  # where params come from: the config and hydra.* overrides
    except Exception:  # noqa: BLE001 - something else fails too: Hydra's error says what
        return None
    if OmegaConf.select(cfg, "hydra.sweeper.params", default=None) is not None:
        return None
    return (f"override '{hits[0].input_line}': hydra.sweeper.params is null in this config and Hydra 1.3 cannot "
            f"set keys of it from the command line; sweep with the override itself (e.g. -m seed=0,1), or set "
            f"hydra.sweeper.params in a config file of your own (-cd DIR -cn NAME)")


def composition_error_line(command: str, composer: Composer, e: BaseException) -> str:
    """The one line for Hydra's refusal ``e`` of ``composer``'s command line."""
    return (group_override_error(command, composer) or misspelt_key_error(command, composer)
            or sweeper_params_line(composer) or hydra_error_line(e, command))


def precheck(command: str, argv: list[str], task_function):
    """Check the command line before Hydra runs, so a bad one exits 2 with one line (Hydra itself prints
    several lines and exits 1). Composes what Hydra will (:func:`engine.cli.compose.composer_for`: the
    search path with ``--config-dir``/``hydra.searchpath``, ``--config-name``, a single run or each
    value of a sweep) and checks the schema of ``+key`` additions. Command lines from which Hydra
    composes nothing (``-sc``, ``--version``, ``--hydra-help`` ...) are left to Hydra.
    ``HYDRA_FULL_ERROR=1`` keeps Hydra's full trace: a composition error is raised as it is.

    Args:
        command: the essa command. argv: its command line after the command's name.
        task_function: the ``@hydra.main`` task function (its module anchors Hydra's search path).

    Returns:
        The config (``hydra`` node included) Hydra composes for a single run or ``--cfg``; None for a
        sweep or a command line Hydra composes nothing from.

    Raises:
        ConfigError: the one line.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    args = parse_args(argv)
    if args is None:
        return None
    line = flag_error(args)
    if line:
        raise ConfigError(line)
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    try:
        composer = composer_for(args, COMMANDS[command].yaml, task_function, str(CONF_DIR))
    except HydraException as e:
        raise ConfigError(hydra_error_line(e, command)) from None
    try:
        configs = composer.configs()
    except (HydraException, OmegaConfBaseException, AttributeError, AssertionError) as e:
        # AttributeError / AssertionError: OmegaConf's failures to merge into a null node (Hydra fails alike)
        if full_error:
            raise
        raise ConfigError(composition_error_line(command, composer, e)) from None
    for cfg in configs:
        extra = unknown_keys(cfg, command)
        if extra or not config_groups(command):  # a command without groups composes any '+group=...' silently
            line = group_override_error(command, composer)
            if line:
                raise ConfigError(line)
        if extra:
            raise ConfigError(no_such_field_line(command, extra[0], cfg, added=True))
    return None if len(configs) > 1 or composer.multirun and not composer.shows else configs[0]
