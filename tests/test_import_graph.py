"""The import graph of `src/fastgemma` has no cycle, between modules or between subpackages.

Data flows one way: request (cli, server) → engine → runner → model → kernels. Imports are
read with `ast` from the source (module level and inside functions alike), so a cycle hidden
in a function's body counts too.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import fastgemma

PACKAGE = Path(fastgemma.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("fastgemma", *path.relative_to(PACKAGE).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _import_graph() -> dict[str, set[str]]:
    modules = _modules()

    def owner(name: str) -> str | None:  # the module that `name` (a module or a name in one) lives in
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in modules else None

    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [owner(f"{node.module}.{a.name}") or owner(node.module) for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [owner(a.name) for a in node.names]
            else:
                continue
            graph[module] |= {t for t in targets if t is not None and t != module}
    return graph


def _subpackage(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as e:
        return e.args[1]
    return None


def test_no_module_imports_itself_through_others():
    assert _cycle(_import_graph()) is None


def test_subpackages_form_layers():
    """e.g. models never imports engine, kernels never imports models or config."""
    packages: dict[str, set[str]] = defaultdict(set)
    for module, targets in _import_graph().items():
        packages[_subpackage(module)] |= {_subpackage(t) for t in targets} - {_subpackage(module)}
    packages.pop("fastgemma", None)  # the package root re-exports LLM; only entry points import it
    for targets in packages.values():
        targets.discard("fastgemma")
    assert _cycle(packages) is None


def test_the_walk_sees_imports():
    graph = _import_graph()
    assert "fastgemma.models.kv_cache" in graph["fastgemma.models.attention"]
    assert "fastgemma.kernels.native" in graph["fastgemma.kernels.attention"]
