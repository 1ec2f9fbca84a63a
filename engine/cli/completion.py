"""Shell completion (Hydra's ``-sc``/``--shell-completion``) for an app with commands: ``essa <command> ...``.

Hydra's completion scripts register the executable ``basename(sys.argv[0])`` and answer a query
(``essa -sc query=bash``, the command line in ``$COMP_LINE``) by reading every word after the
executable as an override. essa's command word is not one: :func:`route_query` takes it out of
``$COMP_LINE`` and picks that command's config (the first word completes to a command name too),
and :func:`completion_argv0` names the executable ``essa`` rather than ``essa train``.
"""
from __future__ import annotations

import os

FLAGS = ("-sc", "--shell-completion")


def is_completion(argv: list[str]) -> bool:
    """Whether ``argv`` asks Hydra's shell completion (install, uninstall or query)."""
    return any(a in FLAGS for a in argv)


def completion_argv0(argv: list[str]) -> str | None:
    """``sys.argv[0]`` for Hydra's completion: ``essa`` (the console script), so the script it prints
    completes ``essa`` (not ``essa train``, nor ``python`` under ``python -m engine.cli``); None when
    ``argv`` is not a completion request."""
    return "essa" if is_completion(argv) else None


def route_query(argv: list[str], commands: dict, default: str) -> str | None:
    """For ``essa -sc query=<shell>`` (``$COMP_LINE`` holds the line being completed): the command the
    line names (``default`` when none), with its word taken out of ``$COMP_LINE`` so Hydra completes
    that command's overrides. When the cursor is still on the first word, the command names that
    start with it are printed first (one a line for fish). None when ``argv`` is not a query.

    Args:
        argv: the command line after ``essa``. commands: command name -> command. default: the
            command run when none is named.
    """
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("query=")), None)
    line = os.environ.get("COMP_LINE")
    if not is_completion(argv) or query is None or line is None:
        return None
    words = line.split()
    rest = words[1:]
    for i, w in enumerate(words[:-1]):  # the line's own config folder: its groups' options complete too
        if w in ("-cd", "--config-dir") and w not in argv:
            argv += [w, words[i + 1]]
    if rest and rest[0] in commands and (len(rest) > 1 or line.endswith(" ")):
        os.environ["COMP_LINE"] = " ".join([words[0], *rest[1:]]) + (" " if line.endswith(" ") else "")
        return rest[0]
    if not rest or len(rest) == 1 and not line.endswith(" "):
        word = rest[0] if rest else ""
        names = [c for c in commands if c.startswith(word)]
        if names:
            print(("\n" if query == "fish" else " ").join(names))
    return default
