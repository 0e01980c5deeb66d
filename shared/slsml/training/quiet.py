"""TensorFlow's start-up lines kept off the terminal and out of the function logs.

Importing TensorFlow writes lines of its own C++ logging straight to file descriptor 2, whatever
``TF_CPP_MIN_LOG_LEVEL`` says: absl's ``All log messages before absl::InitializeLog() ...``, the oneDNN
notice, the CPU-feature guard. ``install()`` (called by the ``slsml`` command before it imports anything
that imports TensorFlow, and by each local function process) makes the first import of TensorFlow run with
file descriptor 2 captured: those lines are dropped, and anything else written meanwhile is passed on
when the import ends.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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


class _QuietTensorFlow(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` as the other finders do, and has its module run under ``filtered_stderr``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "tensorflow":
            return None
        sys.meta_path.remove(self)  # the first import only, and no recursion into this finder
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        if loader is not None and hasattr(loader, "exec_module"):
            exec_module = loader.exec_module

            def quietly(module: ModuleType) -> None:
                with filtered_stderr():
                    exec_module(module)

            loader.exec_module = quietly  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Keep TensorFlow's start-up lines (and its INFO and WARNING logging) off file descriptor 2 in this
    process. Call it before anything imports TensorFlow; once TensorFlow is imported it does nothing."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlow())
