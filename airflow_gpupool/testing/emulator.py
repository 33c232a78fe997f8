"""Command line entry of the Kubernetes emulator: ``python -m airflow_gpupool.testing.emulator``.

Serve an emulated GPU cluster on a TCP port and write a kubeconfig for it::

    python -m airflow_gpupool.testing.emulator --port 8001 --kubeconfig /tmp/kubeconfig \\
        --nodes nodes.yaml

Point ``KubernetesPodOperator(config_file=..., in_cluster=False)`` or ``kubectl --kubeconfig``
at the file. Pods run through the simulated kubelet; see
:mod:`airflow_gpupool.testing.pods.behaviour` for the annotations that steer them.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from airflow_gpupool.argtypes import bind_address, non_empty, non_negative, port_or_zero
from airflow_gpupool.testing.cluster.nodes import load_nodes
from airflow_gpupool.testing.server import KubernetesEmulatorServer

DESCRIPTION = "Serve an emulated Kubernetes API with GPU nodes and a simulated kubelet."


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the emulator's options to a parser.

    :param parser: the parser
    """
    parser.add_argument(
        "--host", type=bind_address, default="127.0.0.1", help="interface to listen on (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=port_or_zero, default=0, help="TCP port; 0 picks a free one (default: %(default)s)"
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


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``emulator`` command to a CLI's subparsers, with ``func=run``.

    :param subparsers: what ``ArgumentParser.add_subparsers()`` returned
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "emulator", help=DESCRIPTION, description=DESCRIPTION
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """Return the stand-alone parser."""
    parser = argparse.ArgumentParser(
        prog="python -m airflow_gpupool.testing.emulator", description=DESCRIPTION
    )
    return add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted (SIGINT or SIGTERM); return the exit status.

    :param args: parsed arguments
    """
    nodes = load_nodes(args.nodes) if args.nodes else None
    server = KubernetesEmulatorServer(
        nodes,
        host=args.host,
        port=args.port,
        kubeconfig_path=args.kubeconfig,
        namespace=args.namespace,
        default_duration_seconds=args.default_duration,
        access_log=args.access_log,
    )
    stop = threading.Event()

    def handle_signal(signum: int, frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handle_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with server:
            print(
                f"Kubernetes emulator serving {server.url} ({len(server.nodes())} nodes); kubeconfig: {server.kubeconfig_path}",
                flush=True,
            )
            stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and serve.

    :param argv: arguments without the program name; ``sys.argv[1:]`` when ``None``
    """
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
