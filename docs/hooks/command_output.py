"""A command's output in a page, run when the site is built: a line ``<!-- output: slsml ARGS -->`` becomes a
block (open, and foldable) of what ``slsml ARGS`` prints on stdout, 120 columns wide, so that the page shows what the
command prints today. A command that fails fails the build, with its error."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- output: slsml (?P<args>.+?) -->$", re.MULTILINE)
COLUMNS = 120
TIMEOUT_S = 120


class CommandError(Exception):
    """A command a page shows the output of failed."""


def output(args: str) -> str:
    """What ``slsml ARGS`` prints on stdout, in this tree."""
    env = {**os.environ, "COLUMNS": str(COLUMNS), "PYTHONPATH": str(ROOT / "shared"), "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "slsml.cli.main", *shlex.split(args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    if done.returncode != 0:
        raise CommandError(f"slsml {args} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return "\n".join(line.rstrip() for line in done.stdout.strip("\n").splitlines())


def _block(match: re.Match[str]) -> str:
    body = "\n".join("    " + line for line in output(match["args"]).splitlines())
    return f'???+ example "`slsml {match["args"]}`, as it prints today"\n\n    ```text\n{body}\n    ```\n'


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return MARKER.sub(_block, markdown)
