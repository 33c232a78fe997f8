"""``gpupool emulator``: serve an emulated Kubernetes API with GPU nodes (the ``testing`` extra).

The options are declared here rather than taken from :mod:`airflow_gpupool.testing.emulator`:
importing that package needs kmock, and ``gpupool --help`` must work without it. A test keeps the
two parsers alike.
"""

from __future__ import annotations

import argparse
from typing import Any

from airflow_gpupool.argtypes import bind_address, non_empty, non_negative, port_or_zero
from airflow_gpupool.cli.common import require_extra

__all__ = ["DESCRIPTION", "add_arguments", "cmd_emulator", "register"]

DESCRIPTION = "Serve an emulated Kubernetes API with GPU nodes and a simulated kubelet."


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the emulator's options to a parser.

    :param parser: the parser
    """
    parser.add_argument(
        "--host", type=bind_address, default="127.0.0.1", help="interface to listen on (default: %(default)s)"
    )
    parser.add_argument(
        "--port",
        type=port_or_zero,
        default=0,
        help="TCP port; 0 picks a free one (default: %(default)s)",
    )
    parser.add_argument(
        "--kubeconfig", type=non_empty, required=True, help="where to write the kubeconfig for the emulator"
    )
    parser.add_argument(
        "--nodes", default=None, help="YAML or JSON file of nodes (default: a small A100/H100 cluster)"
    )
    parser.add_argument(
        "--namespace", type=non_empty, default="default", help="namespace of the kubeconfig context"
    )
    parser.add_argument(
        "--default-duration",
        type=non_negative,
        default=0.5,
        help="seconds a container runs unless its annotations say otherwise (default: %(default)s)",
    )
    parser.add_argument("--access-log", action="store_true", help="log every API request")
    return parser


def cmd_emulator(args: argparse.Namespace) -> int:
    """Serve the emulator until interrupted; return the exit status."""
    require_extra("kmock", "testing", "gpupool emulator")
    from airflow_gpupool.testing.emulator import run

    return run(args)


def register(subparsers: Any) -> None:
    """Add ``gpupool emulator``.

    :param subparsers: the top-level subparsers
    """
    parser = subparsers.add_parser("emulator", help=DESCRIPTION, description=DESCRIPTION)
    add_arguments(parser)
    parser.set_defaults(func=cmd_emulator)
