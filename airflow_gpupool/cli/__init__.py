"""The ``gpupool`` command: ledger administration, status, debugging and benchmarks.

The ledger URL comes from ``--url``, else ``GPUPOOL_LEDGER_URL``, else ``[gpupool] ledger_url``,
else a SQLite file under ``AIRFLOW_HOME``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from airflow_gpupool.cli import (
    bench,
    controller,
    emulator,
    inventory,
    ledger,
    metrics,
    quota,
    reconcile,
    simulate,
)
from airflow_gpupool.exceptions import GpuPoolError

__all__ = ["build_parser", "main"]

log = logging.getLogger("gpupool")

#: Every command group, in the order ``gpupool --help`` lists them. Registration imports no optional
#: package: a command that needs one imports it when it runs, and says which extra to install.
_REGISTRARS: tuple[Callable[[Any], None], ...] = (
    ledger.register_group,
    inventory.register,
    ledger.register_commands,
    bench.register,
    simulate.register,
    emulator.register,
    reconcile.register,
    controller.register,
    metrics.register,
    quota.register,
)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``gpupool`` command."""
    parser = argparse.ArgumentParser(
        prog="gpupool", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
        stream=sys.stderr,
        force=True,  # Airflow, when imported first, has configured logging to stdout
    )
    try:
        return int(args.func(args) or 0)
    except GpuPoolError as e:
        print(f"gpupool: error: {e}", file=sys.stderr)
        return 2
