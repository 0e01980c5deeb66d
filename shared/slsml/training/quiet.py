"""TensorFlow's start-up lines kept off the terminal and out of the function logs.

Importing TensorFlow writes lines of its own C++ logging straight to file descriptor 2, whatever
``TF_CPP_MIN_LOG_LEVEL`` says: absl's ``All log messages before absl::InitializeLog() ...``, the oneDNN
notice, the CPU-feature guard. ``install()`` (called by the ``slsml`` command before it imports anything
that imports TensorFlow, and by each local function process) makes the first import of TensorFlow run with
file descriptor 2 captured: those lines are dropped, and anything else written meanwhile is passed on
when the import ends.

It also has Keras's first import run with scikit-learn hidden: where scikit-learn is installed, Keras imports it
(and SciPy with it) for wrappers that slsml does not use, a second of CPU of every process that imports Keras
(2.9 CPU-s instead of 3.9 for Keras and TensorFlow). Keras's wrappers then say scikit-learn is not installed;
scikit-learn itself imports as before once Keras is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from types import ModuleType

STARTUP_LINES = re.compile(
    rb"All log messages before absl::InitializeLog\(\) is called"
    rb"|oneDNN custom operations are on"
    rb"|cpu_feature_guard\.cc"
    rb"|^To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags"
)


@contextmanager
def filtered_stderr(pattern: re.Pattern[bytes] = STARTUP_LINES) -> Iterator[None]:
    """Capture file descriptor 2 (C and C++ code writes to it directly) while the block runs; then write
    the lines that do not match ``pattern`` back to it."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = memoryview(b"".join(line for line in captured if not pattern.search(line)))
            while kept:
                kept = kept[os.write(2, kept) :]


@contextmanager
def without_scikit_learn() -> Iterator[None]:
    """Imports of scikit-learn fail while the block runs (unless it is imported already)."""
    hidden = "sklearn" not in sys.modules
    if hidden:
        sys.modules["sklearn"] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        yield
    finally:
        if hidden and "sklearn" in sys.modules and sys.modules["sklearn"] is None:
            del sys.modules["sklearn"]


class _FirstImport(importlib.abc.MetaPathFinder):
    """Finds module ``name`` as the other finders do, and has its module run inside ``around()``."""

    def __init__(self, name: str, around: Callable[[], AbstractContextManager[None]]) -> None:
        self.name = name
        self.around = around

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # the first import only, and no recursion into this finder
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        if loader is not None and hasattr(loader, "exec_module"):
            exec_module = loader.exec_module

            def around(module: ModuleType) -> None:
                with self.around():
                    exec_module(module)

            loader.exec_module = around  # type: ignore[method-assign]
        return spec


FIRST_IMPORTS = {"tensorflow": filtered_stderr, "keras": without_scikit_learn}


def install() -> None:
    """Keep TensorFlow's start-up lines (and its INFO and WARNING logging) off file descriptor 2 in this
    process, and import Keras without scikit-learn. Call it before anything imports Keras or TensorFlow; for
    each already imported it does nothing."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    waiting = {f.name for f in sys.meta_path if isinstance(f, _FirstImport)}
    for name, around in FIRST_IMPORTS.items():
        if name not in sys.modules and name not in waiting:
            sys.meta_path.insert(0, _FirstImport(name, around))
