"""``gpupool node quarantine|release``: an admin's hand on a node's or one GPU's health.

An admin's quarantine outranks the agent, the controller and inventory sync: none of them
releases it; only ``gpupool node release`` does.
"""

from __future__ import annotations

import argparse
from typing import Any

from airflow_gpupool.argtypes import non_empty
from airflow_gpupool.cli.common import open_ledger, print_json, url_arg
from airflow_gpupool.resources import NodeHealth

__all__ = ["cmd_node_health", "register"]


def cmd_node_health(args: argparse.Namespace) -> int:
    """Quarantine a node (or one GPU with --gpu): no new grants there; live grants keep running.

    release gives it back. An admin's quarantine is never undone by inventory sync, the agent or
    the controller.
    """
    health = NodeHealth.QUARANTINED if args.node_command == "quarantine" else NodeHealth.HEALTHY
    reason = args.reason or ""
    with open_ledger(args) as ledger:
        if args.gpu:
            changed = ledger.set_gpu_health(args.node, args.gpu, health, source="admin", reason=reason)
        else:
            changed = ledger.set_health(args.node, health, source="admin", reason=reason)
    what = f"GPU {args.gpu} of node {args.node}" if args.gpu else f"node {args.node}"
    if args.json:
        print_json({"node": args.node, "gpu": args.gpu, "health": health.value, "changed": changed})
    else:
        print(f"{what}: {health.value}" if changed else f"{what}: unchanged")
    return 0


def register(subparsers: Any) -> None:
    """Add ``gpupool node quarantine`` and ``gpupool node release``.

    :param subparsers: the top-level subparsers
    """
    group = subparsers.add_parser("node", help="quarantine or release a node or one of its GPUs")
    actions = group.add_subparsers(dest="node_command", metavar="ACTION")
    actions.required = True
    for action, text in (
        ("quarantine", "take a node (or one GPU) out of placement; live grants keep running"),
        ("release", "give a quarantined node (or GPU) back to placement"),
    ):
        p = actions.add_parser(action, help=text, description=cmd_node_health.__doc__)
        url_arg(p)
        p.add_argument("node", type=non_empty, help="the node's name")
        p.add_argument("--gpu", metavar="UUID", type=non_empty, help="only this GPU (its UUID, or its index)")
        p.add_argument(
            "--reason",
            type=non_empty,
            required=action == "quarantine",
            help="why, for status and the UI" + (" (required)" if action == "quarantine" else ""),
        )
        p.add_argument("--json", action="store_true", help="print one JSON object")
        p.set_defaults(func=cmd_node_health)
