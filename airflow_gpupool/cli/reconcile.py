"""``gpupool reconcile``: release grants whose pods finished, vanished or never appeared; end orphans."""

from __future__ import annotations

import argparse
import json
from typing import Any

from airflow_gpupool.argtypes import non_empty, number
from airflow_gpupool.cli.common import cluster_args, kubernetes_api_errors, open_ledger
from airflow_gpupool.controller.reconcile import DEFAULT_GRACE_SECONDS
from airflow_gpupool.exceptions import GpuPoolError

__all__ = ["cmd_reconcile", "register"]


def cmd_reconcile(args: argparse.Namespace) -> int:
    """Release grants whose pods finished, vanished or never appeared (pods labelled gpupool.io/reservation-id).

    An orphaned grant (its lease expired while its pod ran on) is released once its pod is
    finished or gone; a pod still running after --orphan-grace-seconds is deleted.
    """
    from airflow_gpupool.controller.reconcile import check_grace, reconcile
    from airflow_gpupool.inventory.sync import core_v1_api

    grace = check_grace("--grace-seconds", args.grace_seconds)
    orphan_grace = None
    if args.orphan_grace_seconds is not None:
        orphan_grace = check_grace("--orphan-grace-seconds", args.orphan_grace_seconds)
    api = core_v1_api(args.kubeconfig, args.context)
    ledger = open_ledger(args)
    try:
        result = reconcile(
            ledger,
            api,
            grace_seconds=grace,
            orphan_grace_seconds=orphan_grace,
            all_nodes=args.all_nodes,
            id_prefix=args.id_prefix,
            include_manual=args.include_manual,
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
    for rid in result.orphans_kept:
        print(f"  orphan kept {rid}: its pod still runs, within the orphan grace")
    for rid, pod in result.deleted:
        print(f"  deleted pod {pod} of orphan {rid}")
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
        type=number(0),
        default=DEFAULT_GRACE_SECONDS,
        help="how long a grant may wait for its pod (default %(default)g)",
    )
    p.add_argument(
        "--orphan-grace-seconds",
        type=number(0),
        default=None,
        help="how long an orphaned grant's pod may run on before it is deleted "
        "(default [gpupool] orphan_grace_seconds)",
    )
    p.add_argument(
        "--include-manual",
        action="store_true",
        help="also judge grants GpuPodOperator did not make (ids not starting gp-)",
    )
    p.add_argument(
        "--all-nodes",
        action="store_true",
        help="also judge grants on nodes this cluster does not have (one cluster per ledger)",
    )
    p.add_argument(
        "--id-prefix",
        type=non_empty,
        help="judge only reservations whose id starts with this (gp-: GpuPodOperator's)",
    )
    p.set_defaults(func=cmd_reconcile)
