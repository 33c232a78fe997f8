"""Every ``gpupool ... --help`` reads as plain text: no RST double backticks, no doubled percent signs."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from airflow_gpupool.cli import build_parser, plain_text


def parsers(
    parser: argparse.ArgumentParser, name: str = "gpupool"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from parsers(sub, f"{name} {sub_name}")


ALL = list(parsers(build_parser()))


@pytest.mark.parametrize(("name", "parser"), ALL, ids=[name for name, _ in ALL])
def test_help_is_plain_text(name: str, parser: argparse.ArgumentParser) -> None:
    text = parser.format_help()
    assert "``" not in text, name
    assert "%%" not in text, name


def test_every_command_is_checked() -> None:
    names = {name for name, _ in ALL}
    assert {"gpupool", "gpupool simulate", "gpupool metrics serve", "gpupool controller run"} <= names


def test_the_percent_of_the_simulate_description_is_one() -> None:
    (simulate,) = [p for name, p in ALL if name == "gpupool simulate"]
    assert "130% of the GPU capacity" in simulate.format_help()


@pytest.mark.parametrize(
    ("text", "formatted", "expected"),
    [
        ("``--url`` at 130%%", False, "--url at 130%"),
        ("run %(prog)s at 50%%", False, "run %(prog)s at 50%%"),  # argparse formats this one itself
        ("already 50%", True, "already 50%"),
    ],
)
def test_plain_text(text: str, formatted: bool, expected: str) -> None:
    assert plain_text(text, formatted=formatted) == expected
