"""The CLI fuzz's reading of the parser and its arguments: every option of every leaf command, argv.

:func:`parser_options` walks the real ``gpupool`` parser, so the fuzz covers a new option (and
fails until it has values in :mod:`tests.integration.fuzz_options`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from tests.integration.fuzz_options import OPTIONS, Drawn


@dataclass(frozen=True)
class Option:
    """One option of one command, as the parser has it."""

    command: tuple[str, ...]
    name: str  # the first long option string, or a positional's dest
    positional: bool
    required: bool


def _long(action: argparse.Action) -> str:
    longs = [s for s in action.option_strings if s.startswith("--")]
    return longs[0] if longs else action.option_strings[0]


def parser_options(parser: argparse.ArgumentParser, command: tuple[str, ...] = ()) -> Iterator[Option]:
    """Yield every option and positional of every leaf command of ``parser`` (``--help`` aside)."""
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        positional = not action.option_strings
        yield Option(command, action.dest if positional else _long(action), positional, bool(action.required))
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parser_options(sub, (*command, name))


def leaf_commands(parser: argparse.ArgumentParser) -> dict[tuple[str, ...], list[Option]]:
    """Return each leaf command's options (the top level's ``--verbose`` under ``()``)."""
    out: dict[tuple[str, ...], list[Option]] = {}
    for option in parser_options(parser):
        out.setdefault(option.command, []).append(option)
    return out


def argv(command: tuple[str, ...], drawn: dict[str, Drawn], paths: dict[str, str]) -> list[str]:
    """Build the arguments: options as ``--opt=value`` (a value may start with '-'), then positionals.

    The top level's options (``--verbose``) go before the command's words.
    """
    top = [name for name in drawn if name in OPTIONS[()]]
    options: list[str] = []
    positionals: list[str] = []
    for name, (value, _valid) in drawn.items():
        if name in top:
            continue
        text = None if value is None else format_value(value, paths)
        if not name.startswith("-"):
            positionals.append(text or "")
        elif text is None:
            options.append(name)
        else:
            options.append(f"{name}={text}")
    return [*top, *command, *options, *(["--", *positionals] if positionals else [])]


class _Paths(dict[str, str]):
    def __missing__(self, key: str) -> str:  # hypothesis text with braces is taken as it is
        return "{" + key + "}"


def format_value(value: str, paths: dict[str, str]) -> str:
    try:
        return value.format_map(_Paths(paths))
    except (ValueError, IndexError, AttributeError, KeyError):
        return value


def draws_of(command: tuple[str, ...], names: list[str]) -> st.SearchStrategy[dict[str, Drawn]]:
    """Return draws for ``names`` of ``command`` (the top level's ``--verbose`` is ``()``'s)."""
    table = {**OPTIONS[()], **OPTIONS[command]}
    return st.fixed_dictionaries({n: table[n].strategy() for n in names})


def describe(drawn: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v[0]!r}" + ("" if v[1] is not False else " (invalid)") for k, v in drawn.items())
