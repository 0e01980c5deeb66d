"""The CLI reference page (``cli.md``), generated at build time from ``slsml.cli.main.build_parser()``.

Every command and subcommand, its usage, and each option with its argument, default and help, as argparse
knows them, so the page cannot drift from the command.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PAGE = "cli.md"
_STATED_DEFAULT = re.compile(r"\s*\(default [^()]*\)$")  # the default column says it
INTRO = """# CLI reference

Generated from the `slsml` command's parser when the site is built: every command, every option.
"""


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    """Each command of ``parser`` depth first, with its words after ``slsml`` and its one-line help."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), sub, helps.get(name, "")
                yield from commands(sub, (*path, name))


def _cell(text: str) -> str:
    return html.escape(" ".join(text.split()), quote=False).replace("|", "\\|")


def _invocation(formatter: argparse.HelpFormatter, action: argparse.Action) -> str:
    """The option's names (kept on one line) and its argument, or a positional argument's name."""
    if not action.option_strings:
        return f"<code>{html.escape(formatter._format_action_invocation(action))}</code>"
    names = ", ".join(f'<code class="nowrap">{html.escape(name)}</code>' for name in action.option_strings)
    if action.nargs == 0:
        return names
    argument = formatter._format_args(action, formatter._get_default_metavar_for_optional(action))
    return f"{names} <code>{html.escape(argument).replace('|', '&#124;')}</code>"


def _options(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        default = action.default
        shown = "" if default is None or default is False or default == [] or default == argparse.SUPPRESS else default
        help_text = formatter._expand_help(action) if action.help else ""
        if shown != "":
            help_text = _STATED_DEFAULT.sub("", help_text)
        rows.append(f"| {_invocation(formatter, action)} | {_cell(str(shown))} | {_cell(help_text)} |")
    return ["| option | default | what |", "|---|---|---|", *rows]


def synopsis(path: tuple[str, ...], parser: argparse.ArgumentParser) -> str:
    """``slsml run start [options]``, with the positional arguments named."""
    positionals = [
        action.metavar if isinstance(action.metavar, str) else action.dest
        for action in parser._get_positional_actions()
        if not isinstance(action, argparse._SubParsersAction)
    ]
    return " ".join(["slsml", *path, "[options]", *positionals])


def _prose(parser: argparse.ArgumentParser, help_text: str = "") -> list[str]:
    """A command's one-line help, its description where it says more, and its epilog."""
    texts = [help_text, *(text for text in (parser.description, parser.epilog) if text and text != help_text)]
    return [line for text in texts if text for line in (_cell(text), "")]


def render(parser: argparse.ArgumentParser) -> str:
    """The whole reference page as Markdown."""
    lines = [INTRO, "## slsml", "", *_prose(parser), *_options(parser), ""]
    for path, sub, help_text in commands(parser):
        lines += [f"{'#' * min(len(path) + 1, 4)} slsml {' '.join(path)}", "", *_prose(sub, help_text)]
        if not any(isinstance(action, argparse._SubParsersAction) for action in sub._actions):
            lines += ["```text", synopsis(path, sub), "```", ""]
        lines += [*_options(sub), ""]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The ``slsml`` parser of this tree (not of another installed copy)."""
    sys.path.insert(0, str(ROOT / "shared"))
    from slsml.cli.main import build_parser as slsml_parser

    return slsml_parser()


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, PAGE, content=render(build_parser())))
    return files
