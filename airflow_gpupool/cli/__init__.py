"""The ``gpupool`` command: ledger administration, status, debugging and benchmarks.

The ledger URL comes from ``--url``, else ``GPUPOOL_LEDGER_URL``, else ``[gpupool] ledger_url``,
else a SQLite file under ``AIRFLOW_HOME``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_gpupool.cli import (
    agent,
    bench,
    controller,
    emulator,
    inventory,
    ledger,
    metrics,
    node,
    quota,
    reconcile,
    simulate,
    traces,
)
from airflow_gpupool.exceptions import GpuPoolError

if TYPE_CHECKING:
    from typing import TextIO

__all__ = ["EXIT_BROKEN_PIPE", "build_parser", "main"]

log = logging.getLogger("gpupool")

#: Every command group, in the order ``gpupool --help`` lists them. Registration imports no optional
#: package: a command that needs one imports it when it runs, and says which extra to install.
_REGISTRARS: tuple[Callable[[Any], None], ...] = (
    ledger.register_group,
    inventory.register,
    ledger.register_commands,
    bench.register,
    simulate.register,
    traces.register,
    emulator.register,
    reconcile.register,
    controller.register,
    metrics.register,
    quota.register,
    agent.register,  # issue 17: the node agent
    node.register,
)


def plain_text(text: str, *, formatted: bool) -> str:
    """Return docstring text as a terminal shows it: no RST double backticks, ``%%`` as ``%``.

    argparse %-formats help strings (so they write ``%%``) but descriptions only when they
    name ``%(prog)``; either way the reader should see one ``%``.

    :param text: a description or an expanded help string
    :param formatted: whether argparse has already %-formatted it
    """
    text = text.replace("``", "")
    return text if formatted or "%(prog)" in text else text.replace("%%", "%")


class _PlainTextMixin(argparse.HelpFormatter):
    """Show descriptions and help as plain text (kit, issue 15: no ``code`` markup, no ``130%%``)."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text, formatted=False))

    def _expand_help(self, action: argparse.Action) -> str:
        return plain_text(super()._expand_help(action), formatted=True)


class _PlainHelpFormatter(_PlainTextMixin, argparse.HelpFormatter):
    """Wrapped plain text, for the subcommands."""


class _PlainRawDescriptionFormatter(_PlainTextMixin, argparse.RawDescriptionHelpFormatter):
    """Plain text with the description's own line breaks, for ``gpupool --help``."""


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose subcommand parsers show plain text too (they are built as this class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        chosen = kwargs.get("formatter_class", argparse.HelpFormatter)
        if chosen is argparse.RawDescriptionHelpFormatter:
            chosen = _PlainRawDescriptionFormatter
        elif not issubclass(chosen, _PlainTextMixin):
            chosen = _PlainHelpFormatter
        super().__init__(*args, **{**kwargs, "formatter_class": chosen})


class _StderrHandler(logging.StreamHandler["TextIO"]):
    """Write to ``sys.stderr`` as it is when a record is logged, as ``logging.lastResort`` does.

    Run in-process (tests, a notebook), the command leaves this handler on the root logger; holding
    the stream ``sys.stderr`` was at setup would keep it after its owner closes it (pytest closes
    each test's capture stream), and every later record would print "--- Logging error ---".
    """

    def __init__(self) -> None:
        logging.Handler.__init__(self)  # StreamHandler's would pin the stream

    @property
    def stream(self) -> TextIO:  # type: ignore[override]  # read-only: always the current stderr
        return sys.stderr


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``gpupool`` command."""
    parser = _Parser(prog="gpupool", description=__doc__, formatter_class=_PlainRawDescriptionFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for register in _REGISTRARS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``gpupool`` command; return its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[_StderrHandler()],
        force=True,  # Airflow, when imported first, has configured logging to stdout
    )
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader gone fails here, in the handler below, not at the exit's flush
        return code
    except GpuPoolError as e:
        print(f"gpupool: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader left early (`gpupool status --json | head`): nothing is wrong, and nothing
        # more can be said to it; stdout goes to /dev/null so the interpreter's last flush is quiet.
        _silence_stdout()
        return EXIT_BROKEN_PIPE


#: What a shell reports for a command its reader closed: 128 + SIGPIPE.
EXIT_BROKEN_PIPE = 141


def _silence_stdout() -> None:
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # run in-process with stdout captured
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
