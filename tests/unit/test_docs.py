"""The docs site builds with warnings as errors; its CLI reference lists every flag of every command and its
architecture page every module; the README stays short, and its commands are the Makefile's."""

from __future__ import annotations

import argparse
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slsml.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "shared" / "slsml"
README = ROOT / "README.md"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return out


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _commands(sub, (*path, name))


def _sections(page: str) -> dict[str, str]:
    """Heading text → the HTML up to the next heading."""
    parts = re.split(r"<h[1-4][^>]*>(.*?)</h[1-4]>", page)
    headings = [html.unescape(re.sub(r"<[^>]+>", "", heading)).replace("¶", "").strip() for heading in parts[1::2]]
    return dict(zip(headings, parts[2::2], strict=True))


def test_the_cli_reference_lists_every_flag_of_every_command(site: Path) -> None:
    sections = _sections((site / "cli" / "index.html").read_text())
    commands = list(_commands(build_parser()))
    assert {"run start", "plan", "data put", "local up"} <= {" ".join(path) for path, _ in commands}
    for path, parser in commands:
        section = sections[" ".join(("slsml", *path)).strip()]
        listed = {html.unescape(code) for code in re.findall(r"<code[^>]*>(.*?)</code>", section)}
        for action in parser._actions:
            if action.option_strings:
                assert set(action.option_strings) <= listed, (path, action.option_strings)
            elif not isinstance(action, argparse._SubParsersAction):
                assert (action.metavar or action.dest) in listed, (path, action.dest)


def test_the_architecture_page_lists_every_module(site: Path) -> None:
    page = (site / "architecture" / "index.html").read_text()
    modules = [path for path in PACKAGE.rglob("*.py") if path.name != "__init__.py"]
    assert len(modules) > 50
    for module in modules:
        assert f'<code class="nowrap">{module.relative_to(PACKAGE.parent)}</code>' in page, module


def test_the_cost_page_shows_what_slsml_plan_prints(site: Path) -> None:
    page = html.unescape((site / "cost" / "index.html").read_text())
    assert "<!-- output:" not in page
    for printed in ("per epoch", "one iteration, steady state: the critical path", "→ fastest:", "binds first"):
        assert printed in page, printed


def test_the_readme_fits_on_a_screen_or_two_and_names_every_package() -> None:
    readme = README.read_text()
    assert len(readme.splitlines()) <= 250
    for init in PACKAGE.rglob("__init__.py"):
        if init.parent != PACKAGE:
            assert f"`{init.parent.relative_to(PACKAGE).as_posix()}`" in readme, init.parent


def test_the_readme_links_every_page_of_the_docs() -> None:
    readme = README.read_text()
    pages = [page for page in (ROOT / "docs").glob("*.md") if page.name not in {"index.md", "contributing.md"}]
    assert len(pages) >= 12
    for page in pages:
        assert f"](docs/{page.name})" in readme, page.name


def test_the_readmes_make_commands_are_targets_of_the_makefile() -> None:
    targets = set(re.findall(r"^([a-z]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    commands = set(re.findall(r"^make ([a-z]+)", README.read_text(), re.MULTILINE))
    assert {"demo", "test"} <= commands
    assert commands <= targets, commands - targets
