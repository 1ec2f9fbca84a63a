"""``essa <command> --help``: the config groups the command takes, in Hydra's own help.

conf/hydra/essa.yaml sets ``hydra.help`` (Hydra's documented way to shape ``--help``); its template
calls the OmegaConf resolver ``essa_groups`` registered here, which lists the groups of the composed
config (``hydra.runtime.choices``) and the overlay groups the command takes (``+experiment=...``),
each with its options on the search path (conf/ and any ``--config-dir``). Hydra's own
``$APP_CONFIG_GROUPS`` would list every group on the search path, also those of other commands.
"""
from __future__ import annotations

RESOLVER = "essa_groups"


def groups_text(config_name: str, choices) -> str:
    """Lines ``group: option, ... (now <choice>)`` for the groups in ``choices`` (``hydra.runtime.choices``
    of the composed config; Hydra's ``hydra/...`` left out), then the overlay groups the command of
    ``config_name`` takes, each ``group (add with +group=option): option, ...``."""
    from hydra.core.global_hydra import GlobalHydra

    from engine.commands import hydra_commands

    from .compose import Composer
    from .overrides import overlay_groups

    if not GlobalHydra.instance().is_initialized():
        return "(run as `essa <command> --help`)"
    composer = Composer(GlobalHydra.instance().config_loader(), config_name, [])
    options = composer.groups()
    lines = [f"{g}: {', '.join(options.get(g, []))} (now {c})" for g, c in sorted(dict(choices).items())
             if not g.startswith("hydra") and g in options]
    command = next((n for n, c in hydra_commands().items() if c.yaml == config_name), None)
    if command:
        lines += [f"{g} (add with +{g}=option): {', '.join(opts)}"
                  for g, opts in sorted(overlay_groups(command, composer).items())]
    return "\n".join(lines) or "(none)"


def register_help_resolver() -> None:
    """Register :func:`groups_text` as the OmegaConf resolver ``essa_groups`` (once)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, groups_text)
