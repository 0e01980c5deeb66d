"""The package's import graph: no module imports itself back through others, and its packages form layers
(a package never imports one that imports it back), counting imports inside functions too."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

import slsml

ROOT = Path(slsml.__file__).parent


def _modules() -> dict[str, Path]:
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """Module → the slsml modules it imports, anywhere in its body (``from slsml.a import b`` counts as
    ``slsml.a.b`` where that is a module)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    dotted = f"{node.module}.{alias.name}"
                    found.add(dotted if dotted in modules else node.module)
        graph[name] = {m for m in found if m in modules and m != name and m != "slsml"}
    return graph


def _package(module: str, modules: dict[str, Path]) -> str:
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Package → the packages its modules import (the top package, the public API, left out)."""
    modules = _modules()
    packages: dict[str, set[str]] = {}
    for module, imported in graph.items():
        if module == "slsml":
            continue
        source = _package(module, modules)
        targets = {_package(m, modules) for m in imported} - {source, "slsml"}
        packages.setdefault(source, set()).update(targets)
    return packages


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return None


def test_no_module_imports_itself_back() -> None:
    cycle = _cycle(import_graph())
    assert cycle is None, f"import cycle: {' → '.join(cycle)}"


def test_packages_import_downward_only() -> None:
    cycle = _cycle(package_graph(import_graph()))
    assert cycle is None, f"packages import each other: {' → '.join(cycle)}"


def test_the_checks_find_a_cycle() -> None:
    graph = import_graph()
    spec, cost = "slsml.spec.config", "slsml.cost.predict"
    assert cost not in graph[spec]
    graph[spec] = graph[spec] | {cost}  # the config importing the cost model, which imports the config
    with pytest.raises(AssertionError):
        assert _cycle(graph) is None
    with pytest.raises(AssertionError):
        assert _cycle(package_graph(graph)) is None


def test_the_search_engine_sits_below_the_client() -> None:
    """``slsml.search`` (the hyperparameter search's engine and records) knows nothing of how runs start or are
    shown: ``slsml.client.tune`` drives the runs on it, and the command on that."""
    packages = package_graph(import_graph())
    assert "slsml.search" in packages["slsml.client"] and "slsml.search" in packages["slsml.cli"]
    assert not packages["slsml.search"] & {"slsml.client", "slsml.cli", "slsml.local", "slsml.pipeline"}
