"""``gpupool reconcile``: release grants whose pods finished or never appeared."""

from __future__ import annotations

import argparse
import json
from typing import Any

from airflow_gpupool.cli.common import cluster_args, kubernetes_api_errors, open_ledger
from airflow_gpupool.controller.reconcile import DEFAULT_GRACE_SECONDS
from airflow_gpupool.exceptions import GpuPoolError

__all__ = ["cmd_reconcile", "register"]


def cmd_reconcile(args: argparse.Namespace) -> int:
    """Release grants whose pods finished or never appeared (pods labelled gpupool.io/reservation-id)."""
    from airflow_gpupool.controller.reconcile import reconcile
    from airflow_gpupool.inventory.sync import core_v1_api

    api = core_v1_api(args.kubeconfig, args.context)
    ledger = open_ledger(args)
    try:
        result = reconcile(
            ledger, api, grace_seconds=args.grace_seconds, all_nodes=args.all_nodes, id_prefix=args.id_prefix
        )
    except kubernetes_api_errors() as e:
        raise GpuPoolError(f"cannot list pods or nodes: {e}") from e
    finally:
        ledger.close()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        return 0
    print(f"reconcile: {result.summary()}")
    for rid, reason in result.released:
        print(f"  released {rid}: {reason}")
    return 0


def register(subparsers: Any) -> None:
    """Add ``gpupool reconcile``.

    :param subparsers: the top-level subparsers
    """
    p = subparsers.add_parser(
        "reconcile", help="release grants whose pods are gone or finished", description=cmd_reconcile.__doc__
    )
    cluster_args(p)
    p.add_argument(
        "--grace-seconds",
        type=float,
        default=DEFAULT_GRACE_SECONDS,
        help="how long a grant may wait for its pod (default %(default)g)",
    )
    p.add_argument(
        "--all-nodes",
        action="store_true",
        help="also judge grants on nodes this cluster does not have (one cluster per ledger)",
    )
    p.add_argument(
        "--id-prefix", help="judge only reservations whose id starts with this (gp-: GpuPodOperator's)"
    )
    p.set_defaults(func=cmd_reconcile)
