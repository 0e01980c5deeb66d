"""The docs run as written: every fenced block of the README and of the pages of ``docs/`` runs, in the site's
order, in one folder a reader would work in, or is marked as what it is (the convention is CONTRIBUTING.md's
*Blocks of the docs*)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from slsml.local.service import STATE_HOME_ENV

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+)(?P<info>[^`]*)$")
MARKER = re.compile(r"^\s*<!-- (?P<kind>file|continues|copy|not-run): (?P<value>.+?) -->\s*$")
SHOWN = {"text", "mermaid"}
RUN = {"python", "bash"}
BLOCK_TIMEOUT_S = 900


@dataclass
class Block:
    page: str
    line: int
    language: str
    text: str
    kind: str = ""  # the marker's: file, continues, copy, not-run; "" when unmarked
    value: str = ""

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.language or 'no language'})"


def pages() -> list[str]:
    """The README, then the site's pages in its order (mkdocs.yml's nav)."""

    def walk(entries: list) -> list[str]:
        out: list[str] = []
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            out += walk(value) if isinstance(value, list) else [f"docs/{value}"]
        return out

    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)  # no !!python tags resolved
    return ["README.md", *[_included(page) for page in walk(config["nav"]) if (ROOT / page).exists()]]


def _included(page: str) -> str:
    """The file a page includes whole (``--8<-- "FILE"``, as docs/contributing.md includes CONTRIBUTING.md), or it."""
    snippet = re.fullmatch(r'--8<-- "(?P<file>[^"]+)"\s*', (ROOT / page).read_text())
    return snippet["file"] if snippet else page


def blocks(page: str, text: str | None = None) -> list[Block]:
    """The fenced blocks of ``page`` (or of ``text``, as the page) with their markers."""
    lines = (ROOT / page).read_text().splitlines() if text is None else text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == opened["fence"])
        indent = len(opened["indent"])
        body = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        before = next((line for line in reversed(lines[:i]) if line.strip()), "")
        marker = MARKER.match(before)
        language = opened["info"].split()[0] if opened["info"].strip() else ""
        block = Block(page, i + 1, language, body)
        if marker:
            block.kind, block.value = marker["kind"], marker["value"].strip('"')
        found.append(block)
        i = end + 1
    return found


def every_block() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]


def mistakes(all_blocks: list[Block]) -> list[str]:
    """What the markers get wrong, before anything runs."""
    wrong: list[str] = []
    for n, block in enumerate(all_blocks):
        later = "".join(other.text + other.value for other in all_blocks[n + 1 :])
        if block.language not in SHOWN | RUN:
            wrong.append(f"{block}: a block is ```python, ```bash, ```text (output) or ```mermaid")
        elif block.language in SHOWN and block.kind:
            wrong.append(f"{block}: a {block.language} block is never run; it takes no marker")
        elif block.kind == "file" and not re.search(
            rf"{re.escape(block.value)}|import {Path(block.value).stem}\b", later
        ):
            wrong.append(f"{block}: no later block uses the file {block.value}")
        elif block.kind == "continues" and not any(
            other.kind == "file" and other.value == block.value for other in all_blocks[:n]
        ):
            wrong.append(f"{block}: no earlier block is the file {block.value}")
        elif block.kind == "copy" and block.text not in {
            other.text for other in blocks(_included(block.value)) if other.kind not in {"copy", "not-run"}
        }:
            wrong.append(f"{block}: {block.value} has no block with this text that runs")
    return wrong


def test_every_block_of_the_docs_is_run_or_marked() -> None:
    all_blocks = every_block()
    assert len(all_blocks) > 60
    assert mistakes(all_blocks) == []


def _folder(tmp_path: Path) -> dict[str, str]:
    """A reader's folder: ``.venv/bin/python`` and ``.venv/bin/slsml`` of this tree, a state directory of its own."""
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, command in {"python": "", "slsml": " -m slsml.cli.main"}.items():
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}"{command} "$@"\n')
        (bin_dir / name).chmod(0o755)
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT / "shared"),
        STATE_HOME_ENV: str(tmp_path / "state"),
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "COLUMNS": "120",
    }


def _run(command: list[str], cwd: Path, env: dict[str, str], what: str) -> str | None:
    """None if ``command`` succeeded, else what it printed last."""
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    if done.returncode == 0:
        return None
    return f"{what} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"


def run_blocks(all_blocks: list[Block], folder: Path) -> list[str]:
    """Run ``all_blocks`` in order in ``folder``: what each that failed printed last."""
    env = _folder(folder)
    files: dict[str, str] = {}  # a file block's name → its text and its continuations'
    continued: list[str] = []  # the files whose continuations wait to run
    failed: list[str | None] = []

    def flush() -> None:
        for name in continued:
            script = folder / f"{Path(name).stem}-continued.py"
            script.write_text(files[name])
            failed.append(_run([sys.executable, script.name], folder, env, f"{name} and its continuations"))
        continued.clear()

    try:
        for block in all_blocks:
            if block.language in SHOWN or block.kind in {"copy", "not-run"}:
                continue
            if block.kind == "continues":
                files[block.value] += "\n" + block.text
                if block.value not in continued:
                    continued.append(block.value)
                continue
            flush()
            if block.kind == "file":
                (folder / block.value).write_text(block.text)
                files[block.value] = block.text
            elif block.language == "python":
                (folder / "block.py").write_text(block.text)
                failed.append(_run([sys.executable, "block.py"], folder, env, str(block)))
            else:
                failed.append(_run(["bash", "-e", "-o", "pipefail", "-c", block.text], folder, env, str(block)))
        flush()
    finally:  # a page that brought the local service up and failed before its `local down`
        subprocess.run(
            [sys.executable, "-m", "slsml.cli.main", "local", "down"], cwd=folder, env=env, capture_output=True
        )
    return [failure for failure in failed if failure]


def test_the_docs_run_as_written(tmp_path: Path) -> None:
    all_blocks = every_block()
    assert mistakes(all_blocks) == []
    assert run_blocks(all_blocks, tmp_path) == []


PAGE = """
<!-- file: make.py -->

```python
open("made.txt", "w").write("made")
```

<!-- continues: make.py -->

```python
assert open("made.txt").read() == "made"
{fragment}
```

```bash
.venv/bin/python make.py
{shell}
```
"""


@pytest.mark.parametrize(
    ("fragment", "shell", "failing"),
    [
        ("", "grep -q made made.txt", []),
        ("raise SystemExit(3)", "true", ["make.py and its continuations exited 3"]),
        ("", "false\ntrue", ["page.md:15 (bash) exited 1"]),
        ("", "false | cat", ["page.md:15 (bash) exited 1"]),
        ("", ".venv/bin/slsml run list --wrokers 2", ["page.md:15 (bash) exited 2"]),
    ],
)
def test_a_block_that_fails_fails_the_run(tmp_path: Path, fragment: str, shell: str, failing: list[str]) -> None:
    page = blocks("page.md", PAGE.format(fragment=fragment, shell=shell))
    assert mistakes(page) == []
    assert [failure.split(":\n")[0] for failure in run_blocks(page, tmp_path)] == failing


def test_a_block_neither_run_nor_marked_is_a_mistake() -> None:
    page = blocks(
        "page.md",
        "```\nno language\n```\n\n<!-- file: unused.py -->\n\n```python\npass\n```\n\n"
        "<!-- continues: nothing.py -->\n\n```python\npass\n```\n\n"
        "<!-- copy: README.md -->\n\n```bash\nnot there\n```\n",
    )
    assert [mistake.split(": ", 1)[0] for mistake in mistakes(page)] == [
        "page.md:1 (no language)",
        "page.md:7 (python)",
        "page.md:13 (python)",
        "page.md:19 (bash)",
    ]
