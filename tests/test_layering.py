"""The layering of the code: imports only run down the floors, and no imports close a circle.

Every module of ``engine/``, ``strategies/`` and ``rewards/`` is parsed (imports inside functions
included, so a lazy import cannot hide an upward one). A module's room is the longest prefix of its
dotted name in :data:`FLOORS`; an import from room A to room B is allowed when B's floor is below A's,
or when A and B are the same room (a package's modules may use each other), and never when it closes
a circle. docs/ARCHITECTURE.md draws the same table.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

FLOORS = {
    # outside the engine: leaves that import nothing of ours
    "strategies": 0, "rewards": 0,
    # leaves of the engine: the config base, atomic files, Ctrl-C, the CPU, prompts, reasoning-gym's generators
    "engine": 1, "engine.config": 1, "engine.io": 1, "engine.interrupts": 1, "engine.hardware": 1,
    "engine.prompts": 1, "engine.gym_tasks": 1,
    # data and model
    "engine.model": 2, "engine.tasks": 2,
    # PEFT files and the warm start, generation engines, run files and reports, strategy building
    "engine.lora": 3, "engine.backends": 3, "engine.results": 3, "engine.search": 3,
    # population evaluation (local, Ray), held-out validation, scoring passes
    "engine.evaluation": 4,
    # the GRPO trainer pieces; the strategy lab
    "engine.grpo": 5, "engine.lab": 5,
    # the commands (one run each), then the command line
    "engine.commands": 6,
    "engine.cli": 7,
}


def modules(root: Path, packages=("engine", "strategies", "rewards")) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under ``root/<package>``."""
    out = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` (file ``path``) imports, anywhere in the file."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            # `from pkg import mod` depends on pkg.mod; `from pkg import name` on pkg (its __init__)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `from engine import io` names a module; `import a.b.c` its packages too
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def room(name: str, floors: dict[str, int]) -> str:
    """The longest prefix of ``name`` in ``floors``."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in floors:
            return ".".join(parts[:i])
    raise KeyError(f"{name}: no floor; add its package to FLOORS in tests/test_layering.py")


def violations(root: Path, floors: dict[str, int], packages=("engine", "strategies", "rewards")) -> list[str]:
    """One line per import that runs up a floor (or across rooms of one floor), and per circle."""
    mods = modules(root, packages)
    graph = {m: imports(m, f, set(mods)) for m, f in mods.items()}
    out = []
    for a, targets in sorted(graph.items()):
        ra = room(a, floors)
        for b in sorted(targets):
            rb = room(b, floors)
            if rb != ra and floors[rb] >= floors[ra]:
                out.append(f"{a} (floor {floors[ra]}) imports {b} (floor {floors[rb]}): an import may only run down")
    out += [f"circle: {' -> '.join(c)}" for c in circles(graph)]
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import circle per strongly connected component of more than one module (a path that closes)."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's algorithm
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(_closed_path(sorted(comp), graph))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def _closed_path(comp: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A path inside one component from its first module back to it (breadth first)."""
    start, members = comp[0], set(comp)
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return [start] + path[::-1][1:] + [start] if len(path) > 1 else [start, v, start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def test_imports_only_run_down():
    bad = violations(REPO, FLOORS)
    assert not bad, "\n".join(bad)


def test_every_module_has_a_floor():
    for name in modules(REPO):
        room(name, FLOORS)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return tmp_path


@pytest.mark.parametrize("lower_imports, expected", [
    ("from engine.commands import train\n", "engine.config (floor 1) imports engine.commands.train (floor 6)"),
    ("def f():\n    from engine.commands.train import run\n", "engine.config (floor 1) imports engine.commands.train"),
    ("from engine import io\n", "engine.config (floor 1) imports engine.io (floor 1)"),
])
def test_an_upward_import_fails_with_the_pair(tmp_path, lower_imports, expected):
    """A deliberate upward import (at module level or hidden in a function), or one across two rooms
    of the same floor, is reported with the offending pair."""
    root = _tree(tmp_path, {"engine/__init__.py": "", "engine/io.py": "",
                            "engine/config.py": lower_imports,
                            "engine/commands/__init__.py": "", "engine/commands/train.py": "from engine import config\n"})
    bad = violations(root, FLOORS, packages=("engine",))
    assert any(line.startswith(expected) for line in bad), bad


def test_a_circle_inside_one_package_fails(tmp_path):
    root = _tree(tmp_path, {"engine/__init__.py": "", "engine/commands/__init__.py": "",
                            "engine/commands/a.py": "from engine.commands import b\n",
                            "engine/commands/b.py": "from . import a\n"})
    assert violations(root, FLOORS, packages=("engine",)) == [
        "circle: engine.commands.a -> engine.commands.b -> engine.commands.a"]
