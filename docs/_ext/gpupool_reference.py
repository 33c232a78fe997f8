"""Generate the reference pages from the code, when the docs are built.

Three pages hold only a title and a short note on disk; their reference part is written here on
each build, from what the code declares, so it cannot fall out of step with it:

- ``reference/cli``: every ``gpupool`` command, walked from ``airflow_gpupool.cli.build_parser()``;
- ``reference/configuration``: the ``[gpupool]`` options of ``get_provider_info()``;
- ``reference/metrics``: every metric family the Prometheus collectors yield.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from collections.abc import Iterator
from typing import Any

GENERATED_MARK = "<!-- generated below at build time -->"


def cli_commands(parser: argparse.ArgumentParser, path: str = "gpupool") -> Iterator[tuple[str, str]]:
    """Yield ``(command, help text)`` for the parser and each subcommand, depth first, in --help order.

    :param parser: the ``gpupool`` parser, or one of its subcommand parsers
    :param path: the command line that selects ``parser``
    """
    yield path, parser.format_help()
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from cli_commands(sub, f"{path} {name}")


def cli_reference() -> str:
    """Return the Markdown of every ``gpupool`` command's ``--help``."""
    from airflow_gpupool.cli import build_parser

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: one width for every build
    try:
        commands = list(cli_commands(build_parser()))
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before
    out = ["## Commands", "", "| command | |", "|---|---|"]
    out += [f"| [`{name}`](#{_anchor(name)}) | {_first_line(text)} |" for name, text in commands[1:]]
    out.append("")
    for name, text in commands:
        out += [f"### `{name}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(out)


def _anchor(title: str) -> str:
    """Return MyST's anchor slug for a heading made of ``title`` in backticks (GitHub's rule)."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def _first_line(help_text: str) -> str:
    """Return the description's first line from a ``--help`` text (after the usage lines)."""
    lines = help_text.splitlines()
    body = lines[next((i for i, line in enumerate(lines) if not line.strip()), len(lines)) :]
    for line in body:
        if line.strip() and not line.rstrip().endswith(":"):
            return line.strip().replace("|", "\\|")
    return ""


def configuration_reference() -> str:
    """Return the Markdown of every ``[gpupool]`` option, as ``get_provider_info()`` declares it."""
    from airflow_gpupool.get_provider_info import get_provider_info

    section = get_provider_info()["config"]["gpupool"]
    out = ["## Options", "", section["description"], ""]
    for name, option in section["options"].items():
        out += [f"### `{name}`", ""]
        out += [option["description"], ""]
        out += [f"- type: `{option['type']}`"]
        default = option.get("default")
        out += [f"- default: `{default}`" if default not in (None, "") else "- default: empty"]
        if option.get("example"):
            out += [f"- example: `{option['example']}`"]
        if option.get("version_added"):
            out += [f"- since: {option['version_added']}"]
        out.append("")
    return "\n".join(out)


def metric_families() -> list[Any]:
    """Return every metric family the project's collectors yield, by name.

    The ledger collector runs against an empty in-memory ledger (the families it always yields: the
    pools, the queue, the grants, the counters, the agents' reports, the forecast); the families it
    yields only when there is something to count (quotas) and the drift collector's are built by the
    same functions the collectors call.
    """
    from airflow_gpupool.ledger import Ledger, QuotaUse
    from airflow_gpupool.metrics import GpuPoolCollector, drift_metrics, quota_metrics

    quiet = [logging.getLogger(name) for name in ("airflow_gpupool", "alembic")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:  # the empty ledger's migrations are no news in a docs build
        logger.setLevel(logging.WARNING)
    try:
        with tempfile.TemporaryDirectory() as tmp, Ledger.create(f"sqlite:///{tmp}/ledger.db") as ledger:
            families = list(GpuPoolCollector(ledger).collect())
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    if [f.name for f in families] == ["gpupool_ledger_up"]:  # the collector could not read the ledger
        raise RuntimeError("the metrics collector could not read an empty ledger: see its log line")
    families += quota_metrics([QuotaUse(team="team", flavor="pool:p", nominal=1.0, held=0.0)])
    families += drift_metrics([])
    return sorted({f.name: f for f in families}.values(), key=lambda f: f.name)


def metrics_reference() -> str:
    """Return the Markdown table of every metric: exposed name, type, labels, help."""
    out = ["| metric | type | labels | help |", "|---|---|---|---|"]
    for family in metric_families():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        labels = ", ".join(f"`{label}`" for label in getattr(family, "_labelnames", ()))
        text = family.documentation.replace("|", "\\|")
        out.append(f"| `{name}` | {family.type} | {labels} | {text} |")
    return "\n".join(out) + "\n"


GENERATORS = {
    "reference/cli": cli_reference,
    "reference/configuration": configuration_reference,
    "reference/metrics": metrics_reference,
}


def _fill(app: Any, docname: str, source: list[str]) -> None:
    """Append the generated reference to its page's source (Sphinx's ``source-read`` event)."""
    generate = GENERATORS.get(docname)
    if generate is None:
        return
    if GENERATED_MARK not in source[0]:
        raise ValueError(f"docs/{docname}.md must end with the line {GENERATED_MARK!r}")
    source[0] = source[0] + "\n" + generate()


def setup(app: Any) -> dict[str, Any]:
    """Register the generator with Sphinx."""
    app.connect("source-read", _fill)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
