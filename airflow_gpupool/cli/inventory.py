"""``gpupool inventory load`` and ``inventory sync``: nodes into the ledger, from a file or a cluster."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from airflow_gpupool.argtypes import non_empty
from airflow_gpupool.cli.common import cluster_args, kubernetes_api_errors, open_ledger, url_arg
from airflow_gpupool.exceptions import GpuPoolError
from airflow_gpupool.labels import GPU_RESOURCE

if TYPE_CHECKING:
    from airflow_gpupool.resources import NodeInventory

__all__ = ["cmd_inventory_load", "cmd_inventory_sync", "register"]


def cmd_inventory_load(args: argparse.Namespace) -> int:
    """Load a static YAML inventory into the ledger."""
    from airflow_gpupool.inventory import load_inventory

    nodes = load_inventory(args.file)
    ledger = open_ledger(args, create=args.init)
    change = ledger.upsert_nodes(nodes)
    removed = []
    if args.prune:
        keep = {n.name for n in nodes}
        for record in ledger.snapshot().nodes:
            if record.name not in keep:
                removed.append(f"{record.name} ({ledger.remove_node(record.name)})")
    print(
        f"inventory {args.file}: {len(change.added)} added, {len(change.updated)} updated, "
        f"{len(change.unchanged)} unchanged" + (f", pruned {', '.join(removed)}" if removed else "")
    )
    return 0


def _gpu_cell(node: NodeInventory) -> str:
    whole = sum(1 for g in node.gpus if not g.mig_slices)
    slices = [s.profile for g in node.gpus for s in g.mig_slices]
    model = node.gpus[0].model if node.gpus else "-"
    mig = f" + MIG {len(slices)}x" + "/".join(sorted(set(slices))) if slices else ""
    return f"{whole} {model}{mig}"


def cmd_inventory_sync(args: argparse.Namespace) -> int:
    """Read the cluster's GPU nodes (GPUs, MIG slices, GFD labels, taints, cordons, pools) into the ledger."""
    from airflow_gpupool.inventory.sync import core_v1_api, sync_inventory

    api = core_v1_api(args.kubeconfig, args.context)
    ledger = open_ledger(args, create=args.init)
    try:
        result = sync_inventory(
            ledger,
            api,
            prune=args.prune,
            keep_cpu_nodes=args.keep_cpu_nodes,
            tolerated_taints={GPU_RESOURCE, *(args.tolerate_taint or ())},
        )
    except kubernetes_api_errors() as e:
        raise GpuPoolError(f"cannot list nodes: {e}") from e
    finally:
        ledger.close()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        return 1 if result.errors else 0
    outcome = {n: "added" for n in result.added} | {n: "updated" for n in result.updated}
    rows = [
        (n.name, n.node_pool, n.health.value, _gpu_cell(n), outcome.get(n.name, "unchanged"))
        for n in result.nodes
    ]
    widths = [
        max([len(h)] + [len(r[i]) for r in rows])
        for i, h in enumerate(("NODE", "POOL", "HEALTH", "GPUS", "SYNC"))
    ]
    for row in [("NODE", "POOL", "HEALTH", "GPUS", "SYNC"), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print(f"inventory from Kubernetes: {result.summary()}")
    for name, message in result.errors:
        print(f"  {name}: {message}")
    return 1 if result.errors else 0


def register(subparsers: Any) -> None:
    """Add ``gpupool inventory load`` and ``inventory sync``.

    :param subparsers: the top-level subparsers
    """
    inventory = subparsers.add_parser("inventory", help="load nodes into the ledger").add_subparsers(
        dest="inventory_command", metavar="ACTION"
    )
    inventory.required = True
    p = inventory.add_parser(
        "load", help="load a static YAML inventory", description=cmd_inventory_load.__doc__
    )
    p.add_argument("file", help="inventory YAML (see the docs' Static inventory, docs/concepts/ledger.md)")
    p.add_argument("--prune", action="store_true", help="remove (or drain) ledger nodes absent from the file")
    p.add_argument(
        "--no-init", dest="init", action="store_false", help="fail if the ledger does not exist yet"
    )
    url_arg(p)
    p.set_defaults(func=cmd_inventory_load)
    _sync_parser(inventory)


def _sync_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sync", help="read GPU nodes from Kubernetes into the ledger", description=cmd_inventory_sync.__doc__
    )
    cluster_args(p)
    p.add_argument(
        "--no-prune",
        dest="prune",
        action="store_false",
        help="keep ledger nodes that the cluster does not list (a shared ledger, a static inventory)",
    )
    p.add_argument("--keep-cpu-nodes", action="store_true", help="also store nodes without GPUs")
    p.add_argument(
        "--tolerate-taint",
        action="append",
        type=non_empty,
        metavar="KEY",
        help="taint key GPU pods tolerate (repeatable; nvidia.com/gpu always)",
    )
    p.add_argument(
        "--no-init", dest="init", action="store_false", help="fail if the ledger does not exist yet"
    )
    p.set_defaults(func=cmd_inventory_sync)
