"""A package's modules imported from the code compiled once (``slsml.local.compiled``): the same code objects, and a
source edited since compiled anew."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slsml.local.compiled import PrecompiledSources


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package ``precompiled_pkg`` (a module ``shapes`` and a subpackage ``inner.deep``) on the path; its modules
    are forgotten at the end."""
    root = tmp_path / "precompiled_pkg"
    (root / "inner").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "shapes.py").write_text("def area(side):\n    return side * side\n")
    (root / "inner" / "__init__.py").write_text("")
    (root / "inner" / "deep.py").write_text("from precompiled_pkg.shapes import area\nDEPTH = area(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    for name in [n for n in sys.modules if n == "precompiled_pkg" or n.startswith("precompiled_pkg.")]:
        del sys.modules[name]


def _functions_code(finder: PrecompiledSources, path: Path) -> list[object]:
    return [c for c in finder.compiled[str(path)][1].co_consts if hasattr(c, "co_code")]


def test_modules_run_the_code_compiled_before_and_a_package_outside_is_left_to_python(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    finder = PrecompiledSources(package)
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    importlib.import_module("precompiled_pkg")  # the package itself is found by Python's own finders
    deep = importlib.import_module("precompiled_pkg.inner.deep")
    shapes = sys.modules["precompiled_pkg.shapes"]
    assert deep.DEPTH == 9
    assert shapes.area.__code__ is _functions_code(finder, package / "shapes.py")[0]  # not compiled again
    assert type(deep.__loader__).__name__ == "_Precompiled"
    assert finder.find_spec("json", None) is None


def test_a_source_edited_after_it_was_compiled_is_compiled_anew(package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    finder = PrecompiledSources(package)
    (package / "shapes.py").write_text("def area(side):\n    return side * side * 2\n")
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    shapes = importlib.import_module("precompiled_pkg.shapes")
    assert shapes.area(3) == 18
    assert shapes.area.__code__ is not _functions_code(finder, package / "shapes.py")[0]
