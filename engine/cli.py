"""``essa``: the command line.

    essa train [overrides...]     SFT warm start + ES (default when no command is given)
    essa bench [overrides...]     population-evaluation throughput benchmark
    essa eval  [overrides...]     accuracy / pass@k of a model with or without adapters
    essa grpo  [overrides...]     GRPO / F-GRPO baseline (TRL)
    essa report RUN_DIR [...]     PNG figures + Markdown summary of run directories
    essa prepare-model [--quantization int8,int4] [--model PATH] [--force]
                                  convert the embedded default model once; write quantized copies

Hydra composes each command's config from conf/ (``conf/<command>.yaml``); every field is
overridable and ``-m`` runs sweeps. Bad configuration exits with status 2 and one line naming the
field and the fix.
"""
from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
HYDRA_COMMANDS = {"train": "train", "bench": "bench", "eval": "eval", "grpo": "grpo"}
USER_ERRORS = (ValueError, FileNotFoundError, KeyError)


def _fail(e: BaseException) -> None:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"essa: error: {msg}", file=sys.stderr)
    sys.exit(2)


def _run(command: str, cfg) -> float | None:
    """Hydra's task function: run one job of ``command``.

    Returns:
        ``essa train``: held-out accuracy of the final mean genome (``summary.json`` ``val.mean``,
        a fraction in [0, 1]; None when the run made no final validation), ``essa grpo``: the final
        policy's accuracy, so Hydra sweepers (``hydra/sweeper=optuna``) can optimise it; None for
        the other commands.

    A single run that fails on bad configuration or input exits 2 with one line. In a multirun
    (``-m``) every failure is caught instead: its line goes to ``<job dir>/error.txt`` and the
    job's log, the job returns None (Optuna records a failed trial), and the sweep goes on
    (engine/sweeps.py).
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from . import interrupts
    from .sweeps import clear_job_failure, error_line, record_job_failure

    hc = HydraConfig.get()
    run_dir = hc.runtime.output_dir
    multirun = hc.mode == RunMode.MULTIRUN
    if multirun:
        clear_job_failure(run_dir)
    try:
        if command == "train":
            from .loop import run_train
            from .plugins import check_strategy_choice
            check_strategy_choice(cfg, hc.runtime.choices.get("strategy"))
            result = run_train(cfg, run_dir)
            accuracy = float(result.get("val", {}).get("mean", float("nan")))
            return accuracy if math.isfinite(accuracy) else None  # Optuna 2.10 crashes on a NaN value
        elif command == "bench":
            from .bench import main as bench_main
            bench_main(cfg)
        elif command == "eval":
            from .evaluate import main as eval_main
            eval_main(cfg, run_dir)
        elif command == "grpo":
            from .grpo import main as grpo_main
            result = grpo_main(cfg, run_dir)
            return float(result["accuracy"]) if isinstance(result, dict) and "accuracy" in result else None
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:
        if interrupts.requested():  # e.g. vLLM's EngineDeadError: the Ctrl-C also reached the engine's process
            print(f"essa: interrupted ({type(e).__name__} after Ctrl-C)", file=sys.stderr)
            sys.exit(130)
        user_error = isinstance(e, USER_ERRORS)
        if os.environ.get("ESSA_DEBUG"):
            raise
        if multirun:
            if not user_error:
                logging.getLogger("essa").exception("job failed")  # the traceback, into the job's log
            record_job_failure(run_dir, error_line(e, user_error))
            return None  # not NaN: Optuna 2.10's sweeper crashes on NaN; None makes a failed trial
        if user_error:
            remove_refused_run_dir(run_dir, f"{hc.job.name}.log")
            _fail(e)
        raise
    return None


def remove_refused_run_dir(run_dir: str | Path, job_log: str) -> bool:
    """Remove the run directory Hydra made for a run that was refused before writing anything.

    Only a directory holding nothing but Hydra's ``.hydra/`` (config.yaml, hydra.yaml,
    overrides.yaml) and the job's log ``job_log`` is removed, so a refused run leaves no empty run
    behind for ``essa report`` or ``resume`` to trip on; anything else in it (a run's run.json,
    checkpoints, adapters, a user's own files) keeps the directory. Returns whether it was removed.
    """
    import shutil

    d = Path(run_dir)
    try:
        entries = {p.name for p in d.iterdir()}
        hydra_files = {p.name for p in (d / ".hydra").iterdir()} if (d / ".hydra").is_dir() else None
    except OSError:
        return False
    if hydra_files is None or not hydra_files <= {"config.yaml", "hydra.yaml", "overrides.yaml"}:
        return False
    if not entries <= {".hydra", job_log} or not (d / job_log).is_file() and job_log in entries:
        return False
    shutil.rmtree(d, ignore_errors=True)
    return not d.exists()


def hydra_error_line(e: BaseException, command: str = "train") -> str:
    """One line for a Hydra composition error of ``essa <command>``: the override, what is wrong, and the fix."""
    from hydra.errors import MissingConfigException

    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    first = lines[0] if lines else type(e).__name__
    if isinstance(e, MissingConfigException) or first.startswith("In '") and "Could not find" in first:
        options = []
        if "Available options" in str(e):
            tail = str(e).split("Available options", 1)[1].split("Config search path", 1)[0]
            options = [ln.strip() for ln in tail.splitlines()[1:] if ln.strip()]
        what = first.split("Could not find", 1)[-1].strip(" '")
        return (f"no config '{what}'" + (f"; available: {', '.join(options)}" if options else "")
                + f" (conf/{what.rsplit('/', 1)[0]}/)")
    if first.startswith("Could not override"):
        key = first.split("'")[1] if "'" in first else first
        return f"{key}: no such field; check the spelling (`essa {command} --cfg job` prints every field)"
    if first.startswith("Error merging override") and e.__cause__ is not None:
        cause = str(e.__cause__).strip().splitlines()[0]
        return f"{first.split('override', 1)[1].strip()}: {cause}"
    if first.startswith("Ambiguous value"):
        return f"{first}: write a list as key=[a,b], quote a string as key='a,b', or add -m to sweep"
    return " ".join(ln for ln in lines if not ln.startswith(("See https://", "Set the environment")))


def config_groups(command: str) -> list[str]:
    """The config groups (folders of conf/) that ``conf/<command>.yaml``'s defaults list selects."""
    from omegaconf import OmegaConf

    defaults = OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"{HYDRA_COMMANDS[command]}.yaml")).get("defaults") or []
    names = [k.split()[-1].split("@")[0] for d in defaults if isinstance(d, dict) for k in d]  # "optional x@pkg"
    return sorted(n for n in names if (CONF_DIR / n).is_dir())


def _compose_ok(command: str, overrides: list[str]) -> bool:
    """Whether ``command``'s config composes with ``overrides`` and has no field its schema lacks."""
    from hydra import compose, initialize_config_dir

    from .config import unknown_keys

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return not unknown_keys(compose(config_name=HYDRA_COMMANDS[command], overrides=overrides), command)
    except Exception:  # noqa: BLE001 - any failure means "does not accept"
        return False


def group_override_error(command: str, argv: list[str]) -> str | None:
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
        overrides = OverridesParser.create().parse_overrides(argv)
    except Exception:  # noqa: BLE001 - a malformed override: Hydra's own error says which
        return None
    listed = {c: config_groups(c) for c in HYDRA_COMMANDS}
    for o in overrides:
        group = o.key_or_group
        if group.startswith("hydra") or not (CONF_DIR / group).is_dir() or group in listed[command]:
            continue
        options = sorted(f.stem for f in (CONF_DIR / group).glob("*.yaml"))
        overlay = not any(group in g for g in listed.values())

        def accepts(c: str) -> bool:
            if not listed[c]:
                return False  # a command without config groups (bench) takes none
            return group in listed[c] or overlay and bool(options) and _compose_ok(c, [f"+{group}={options[0]}"])

        if accepts(command):
            if o.type == OverrideType.CHANGE:  # an overlay group is added, not changed
                return (f"override '{o.input_line}': config group '{group}' is an overlay that no defaults list "
                        f"selects; add it with '+': +{o.input_line}")
            continue
        others = [f"essa {c}" for c in HYDRA_COMMANDS if c != command and accepts(c)]
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


def no_such_field_line(command: str, key: str, cfg, value: str | None = None, added: bool = False) -> str:
    """One line for an override of a field ``cfg`` does not have: the key, the nearest field and the fix."""
    near = nearest_field(key, cfg)
    fix = f"did you mean {near if value is None else f'{near}={value}'}?" if near else "check the spelling"
    how = " (added with '+'?)" if added else ""
    return f"{key}: no such field{how}; {fix} (`essa {command} --cfg job` prints every field)"


def misspelt_key_error(command: str, argv: list[str]) -> str | None:
    """One line for an override (``key=value``, no ``+``) of a field ``command``'s config lacks, else None.

    Checks single runs, sweeps (``-m``, every value of a sweep) and runs with Hydra flags (``--cfg job``)
    alike, as Hydra would apply the override, and names the nearest field (:func:`no_such_field_line`).
    Group selections (``task=gsm8k``), ``hydra...`` keys, ``+``/``++``/``~`` overrides are left to Hydra.
    """
    import copy

    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    try:
        args, _ = get_args_parser().parse_known_args(argv)
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except BaseException:  # noqa: BLE001 - a malformed command line (argparse exits): Hydra's own error says which
        return None

    def selects_group(o) -> bool:
        return o.key_or_group.startswith("hydra") or o.package is not None or (CONF_DIR / o.key_or_group).is_dir()

    plain = [o for o in overrides if not selects_group(o) and not (o.is_add() or o.is_force_add() or o.is_delete())]
    if not plain:
        return None
    # the config the plain overrides apply to: with the run's groups and '+' additions (sweeps left out)
    base = [o.input_line for o in overrides if not o.is_sweep_override() and not o.key_or_group.startswith("hydra")
            and (selects_group(o) or o.is_add() or o.is_force_add())]
    cfg = None
    for ovs in (base, []):
        try:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose(config_name=HYDRA_COMMANDS[command], overrides=ovs)
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
        except Exception:  # noqa: BLE001 - the field exists; its value is checked elsewhere
            continue
    return None


def _precheck(command: str, argv: list[str]) -> None:
    """Check the overrides before Hydra runs, so a bad one exits 2 with one line (Hydra itself prints
    several lines and exits 1). The config is composed once; with Hydra flags (``-m``, ``--cfg`` ...)
    only misspelt fields are checked (:func:`misspelt_key_error`). ``HYDRA_FULL_ERROR=1`` keeps
    Hydra's full trace: a composition error is raised as it is, or left to Hydra."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from .config import ConfigError, unknown_keys

    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    if any(a.startswith("-") for a in argv):
        line = None if full_error else misspelt_key_error(command, argv)
        if line:
            _fail(ConfigError(line))
        return
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name=HYDRA_COMMANDS[command], overrides=argv)
    except (HydraException, OmegaConfBaseException) as e:
        if full_error:
            raise
        _fail(ValueError(group_override_error(command, argv) or misspelt_key_error(command, argv)
                         or hydra_error_line(e, command)))
    extra = unknown_keys(cfg, command)
    if extra or not config_groups(command):  # a command without groups composes any '+group=...' silently
        line = group_override_error(command, argv)
        if line:
            _fail(ConfigError(line))
    if extra:
        _fail(ConfigError(no_such_field_line(command, extra[0], cfg, added=True)))


def _hydra(command: str, argv: list[str]) -> None:
    import hydra

    from .config import register_configs

    register_configs()
    _precheck(command, argv)

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=HYDRA_COMMANDS[command])
    def entry(cfg):
        return _run(command, cfg)

    from . import interrupts
    from .sweeps import FINISHED_SWEEPS, failure_lines

    sys.argv = [f"essa {command}"] + argv
    FINISHED_SWEEPS.clear()
    # Ctrl-C / kill -INT stops the run with a resume hint, even where SIGINT was inherited ignored
    # (a background job of a shell without job control) or also reached vLLM's engine process
    with interrupts.handling():
        entry()
    for sweep_dir in FINISHED_SWEEPS:  # multirun: name every failed job, then exit non-zero
        lines = failure_lines(sweep_dir)
        if lines:
            print("essa: error: " + "\n".join(lines), file=sys.stderr)
            sys.exit(1)


def _prepare_model(argv: list[str]) -> None:
    """``essa prepare-model``: the float checkpoint (embedded default, or ``--model``), then one
    quantized copy per ``--quantization`` value (int8, int4; comma-separated or repeated); prints
    each directory."""
    import argparse

    from .model import DEFAULT_MODEL, get_quantization, prepare_embedded_model, quantized_model_path, resolve_model_path

    ap = argparse.ArgumentParser(prog="essa prepare-model", description=_prepare_model.__doc__)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="model.path: HF id, directory or embedded:... (default)")
    ap.add_argument("--quantization", action="append", default=[], help="int8 and/or int4 (comma-separated)")
    ap.add_argument("--force", action="store_true", help="rebuild even when a finished copy exists")
    args = ap.parse_args(argv)
    names = [get_quantization(q).name for arg in args.quantization for q in arg.split(",") if q]
    if args.model == DEFAULT_MODEL:
        path = str(prepare_embedded_model(force=args.force))
    else:
        path = resolve_model_path(args.model)
    print(path)
    for name in names:
        print(quantized_model_path(path, name, force=args.force))


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``essa`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    command = "train"
    if argv and argv[0] in (*HYDRA_COMMANDS, "report", "prepare-model", "help"):
        command = argv.pop(0)
    if argv[:1] in (["-h"], ["--help"]) and command == "train" or command == "help":
        print(__doc__)
        if command == "help":
            return
    if command == "report":
        from .report import cli as report_cli
        return report_cli(argv)
    if command == "prepare-model":
        try:
            _prepare_model(argv)
        except USER_ERRORS as e:
            _fail(e)
        return
    _hydra(command, argv)


if __name__ == "__main__":
    main()
