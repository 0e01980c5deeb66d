"""The package layout on the architecture page, generated at build time from the docstrings of ``shared/slsml``.

Each package with what its ``__init__`` says it holds, and each of its modules with the first sentence of its
docstring. A module without a docstring fails the build, naming it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "shared" / "slsml"
PAGE = "architecture.md"
MARKER = "<!-- modules -->"
_SENTENCE = re.compile(r"(.+?\.)(?:\s|$)")


class LayoutError(Exception):
    """A module the layout cannot describe."""


def summary(path: Path) -> str:
    """The first sentence of a module's docstring, on one line."""
    docstring = ast.get_docstring(ast.parse(path.read_text()))
    if not docstring:
        raise LayoutError(f"{path.relative_to(ROOT)} has no docstring: the architecture page lists it by one")
    paragraph = " ".join(docstring.split("\n\n")[0].split())
    match = _SENTENCE.match(paragraph)
    return (match.group(1) if match else paragraph).rstrip(":.") + "."


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """One section per package, in path order: its docstring, then a table of its modules."""
    lines = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        package = init.parent
        dotted = ".".join(package.relative_to(PACKAGE.parent).parts)
        modules = [module for module in sorted(package.glob("*.py")) if module.name != "__init__.py"]
        lines += [f"### `{dotted}`", "", summary(init), ""]
        if modules:
            lines += ["| module | what it holds |", "|---|---|"]
            for module in modules:
                path = module.relative_to(ROOT / "shared")
                lines.append(f'| <code class="nowrap">{path}</code> | {_cell(summary(module))} |')
            lines.append("")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise LayoutError(f"{PAGE} lost its {MARKER} line, where the module table goes")
    return markdown.replace(MARKER, render())
