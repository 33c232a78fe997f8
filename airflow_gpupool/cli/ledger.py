"""``gpupool ledger init``, ``status``, ``chain``, ``release`` and ``reap``: the ledger by hand (``reserve``: :mod:`.reserve`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from airflow_gpupool.argtypes import non_empty
from airflow_gpupool.cli.cluster import cluster_pods
from airflow_gpupool.cli.common import open_ledger, print_json, table, url_arg
from airflow_gpupool.cli.ledger_init import cmd_ledger_init
from airflow_gpupool.cli.reserve import register as register_reserve

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from airflow_gpupool.ledger import LedgerSnapshot, NodeDrift, QuotaUse, Reservation, StartForecast
    from airflow_gpupool.run_chain import RunChain

__all__ = [
    "cmd_chain",
    "cmd_ledger_init",
    "cmd_reap",
    "cmd_release",
    "cmd_status",
    "format_chain",
    "format_drift",
    "format_status",
    "register_commands",
    "register_group",
]


# -- status -----------------------------------------------------------------------------------


def _gpu_cell(gpu: dict[str, Any]) -> str:
    if gpu["partitioned"]:
        return f"{gpu['idx']}:MIG"
    return f"{gpu['idx']}:{gpu['free_milli'] / 1000:.2f}"


def format_status(
    snapshot: LedgerSnapshot,
    quotas: Sequence[QuotaUse] = (),
    forecasts: Mapping[str, StartForecast] | None = None,
) -> str:
    """Render a ledger snapshot as the tables `gpupool status` prints.

    :param snapshot: the ledger's snapshot
    :param quotas: the stored quotas beside their teams' use (no table when none is stored)
    :param forecasts: the stored forecasts of the waiting requests, by id (the queue's START column)
    """
    from airflow_gpupool.forecast.words import describe_forecast

    out = []
    free_migs = {n.name: sum(len(g.mig_free) for g in n.gpus) for n in snapshot.cluster.nodes}
    rows = [
        [
            n.name,
            n.node_pool,
            n.health,
            len(n.gpus),
            " ".join(_gpu_cell(g) for g in n.gpus) or "-",
            free_migs.get(n.name, 0),
            f"{n.cpu_free / 1000:g}/{n.cpu_milli / 1000:g}",
            f"{n.memory_free // 1024}/{n.memory_mib // 1024}",
        ]
        for n in snapshot.nodes
    ]
    out.append(f"Nodes ({len(rows)}), GPU allocation {snapshot.allocation:.1%}")
    out.append(
        table(
            ["NODE", "POOL", "HEALTH", "GPUS", "FREE PER GPU", "FREE MIG", "CPU FREE", "MEM FREE GiB"], rows
        )
    )
    now = snapshot.taken_at
    grant_rows = []
    for r in snapshot.grants:
        g = r.grant
        assert g is not None  # a snapshot's grants are granted (or orphaned) reservations
        where = f"{g.node}/" + (
            f"{g.mig_slice}({g.mig_profile})" if g.mig_slice else ",".join(map(str, g.gpu_indices))
        )
        grant_rows.append(
            [
                r.id[:12],
                r.holder[:40],
                r.request.team,
                r.request.describe().split(",")[0],
                where,
                _lease_left(r, now),
            ]
        )
    orphaned = sum(r.state.value == "orphaned" for r in snapshot.grants)
    out.append(f"\nGrants ({len(grant_rows)}" + (f", {orphaned} orphaned)" if orphaned else ")"))
    out.append(
        table(["ID", "HOLDER", "TEAM", "SLICE", "WHERE", "LEASE LEFT"], grant_rows)
        if grant_rows
        else "  none"
    )
    queue_rows = [
        [
            r.position,
            r.id[:12],
            r.holder[:40],
            r.request.priority,
            r.request.describe().split(",")[0],
            f"{now - r.created_at:.0f}s",
            describe_forecast((forecasts or {}).get(r.id), now),
        ]
        for r in snapshot.queue
    ]
    out.append(f"\nQueue ({len(queue_rows)})")
    out.append(
        table(["POS", "ID", "HOLDER", "PRIO", "ASKS", "WAITING", "START"], queue_rows)
        if queue_rows
        else "  empty"
    )
    if quotas:
        out.append(f"\nQuotas ({len(quotas)}), in GPUs")
        out.append(
            table(["TEAM", "FLAVOR", "NOMINAL", "HELD", "BORROWED", "LENT", "UNUSED"], _quota_rows(quotas))
        )
    return "\n".join(out)


def _quota_rows(quotas: Sequence[QuotaUse]) -> list[list[str]]:
    return [
        [u.team, u.flavor, *(f"{v:g}" for v in (u.nominal, u.held, u.borrowed, u.lent, u.unused))]
        for u in quotas
    ]


NO_CLUSTER = "the cluster's pods not read: pass --kubeconfig (or --context) to see drift"


def format_drift(rows: Sequence[NodeDrift]) -> str:
    """Render each node's books beside its pods as the table `gpupool status` prints.

    :param rows: :func:`~airflow_gpupool.ledger.ledger_drift`'s rows
    """
    read = any(r.running is not None for r in rows) or not rows
    head = "\nLedger beside the cluster, in GPUs" + ("" if read else f" ({NO_CLUSTER})")
    if not rows:
        return f"{head}\n  no nodes"
    body = [
        [
            r.node,
            *(f"{v:g}" for v in (r.capacity, r.granted, r.external, r.free)),
            "-" if r.running is None else f"{r.running:g}",
            "-" if r.drift is None else f"{r.drift:g}",
            "; ".join(r.mismatched) or "-",
        ]
        for r in rows
    ]
    return (
        head + "\n" + table(["NODE", "GPUS", "GRANTED", "EXTERNAL", "FREE", "RUNNING", "DRIFT", "WHO"], body)
    )


def cmd_status(args: argparse.Namespace) -> int:
    """Print nodes, GPUs, free capacity, grants, the queue (with forecasts), the quotas' use and the drift."""
    from airflow_gpupool.ledger import LedgerForecasts, ledger_drift, quota_uses

    ledger = open_ledger(args)
    read_cluster = args.kubeconfig is not None or args.context is not None
    pods = cluster_pods(args.kubeconfig, args.context)() if read_cluster else None
    snapshot = ledger.snapshot()
    quotas = quota_uses(ledger, snapshot)
    drift = ledger_drift(snapshot, pods)
    forecasts = LedgerForecasts(ledger).get_many()
    if args.json:
        print_json(
            {
                **snapshot.to_dict(),
                "quotas": [u.to_dict() for u in quotas],
                "drift": {"cluster_read": read_cluster, "nodes": [r.to_dict() for r in drift]},
                "forecasts": {rid: f.to_dict() for rid, f in sorted(forecasts.items())},
            }
        )
    else:
        print(format_status(snapshot, quotas, forecasts) + "\n" + format_drift(drift))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    """Say why a request waits and when it is expected to start (the controller's stored forecast)."""
    from airflow_gpupool.forecast.words import describe_position
    from airflow_gpupool.ledger import LedgerForecasts

    ledger = open_ledger(args)
    reservation = ledger.get(args.id)
    forecast = LedgerForecasts(ledger).get(args.id)
    if args.json:
        print_json(
            {
                "id": args.id,
                "state": reservation.state.value,
                "explanation": ledger.explain(args.id),
                "forecast": forecast.to_dict() if forecast else None,
            }
        )
        return 0
    print(ledger.explain(args.id))
    if reservation.state.value == "waiting":
        total = forecast.queue_length if forecast else None
        print(describe_position(reservation.position, total, forecast, ledger.now()))
    return 0


# -- chain ------------------------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}s"


def format_chain(chain: RunChain) -> str:
    """Return a run's GPU steps as a table: one row a step, in order, with how each joined the chain."""
    rows = [
        [
            s.task,
            s.try_number,
            s.state,
            f"{s.node} {s.gpus}" if s.node else "-",
            _seconds(s.waited),
            _seconds(s.gap_before),
            _seconds(s.held),
            ", ".join(
                m
                for m in (
                    "queued ahead" if s.queued_ahead else "",
                    f"handed on from {s.handed_on_from}" if s.handed_on_from else "",
                    f"handed on to {s.handed_on_to}" if s.handed_on_to else "",
                    "admitted as a run" if s.admitted_as_run else "",
                )
                if m
            )
            or "-",
            s.reservation_id,
        ]
        for s in chain.steps
    ]
    head = (
        f"run {chain.run_id} of {chain.dag_id}: {len(chain.steps)} GPU steps, {chain.handed_on} handed on, "
        f"gaps {chain.gap_seconds:.0f}s, first request to last end {chain.span:.0f}s"
    )
    headers = ["TASK", "TRY", "STATE", "WHERE", "WAITED", "GAP", "HELD", "CHAIN", "ID"]
    return head + "\n" + table(headers, rows)


def cmd_chain(args: argparse.Namespace) -> int:
    """Show a DAG run's GPU steps as one chain: in order, each one's wait, the gaps, hand-ons and queue-aheads."""
    from airflow_gpupool.run_chain import read_run_chain

    chain = read_run_chain(open_ledger(args), args.dag_id, args.run_id)
    if args.json:
        print_json(chain.to_dict())
    elif not chain.steps:
        print(f"No GPU step of run {args.run_id} of DAG {args.dag_id} in the ledger.")
    else:
        print(format_chain(chain))
    return 0


# -- release / reap ----------------------------------------------------------------------


def _lease_left(reservation: Reservation, now: float) -> str:
    """Say how long the lease has left, or, for an orphan, whose pod holds its slice since when."""
    from airflow_gpupool.ledger import ReservationState

    g = reservation.grant
    assert g is not None
    if reservation.state is not ReservationState.ORPHANED:
        return f"{g.expires_at - now:.0f}s"
    since = now - (reservation.orphaned_at or now)
    return f"orphaned {since:.0f}s (pod {g.pod_namespace}/{g.pod_name})"


def cmd_release(args: argparse.Namespace) -> int:
    """Release a grant or withdraw a waiting request."""
    result = open_ledger(args).release(args.id, reason=args.reason)
    print(result.message)
    return 0


def cmd_reap(args: argparse.Namespace) -> int:
    """Expire dead leases and overdue requests, then serve the queue."""
    result = open_ledger(args).reap()
    print(f"expired {len(result.expired)}, timed out {len(result.timed_out)}, granted {len(result.granted)}")
    return 0


# -- parsers ------------------------------------------------------------------------------------


def register_group(subparsers: Any) -> None:
    """Add ``gpupool ledger init``.

    :param subparsers: the top-level subparsers
    """
    ledger = subparsers.add_parser("ledger", help="create or migrate the ledger").add_subparsers(
        dest="ledger_command", metavar="ACTION"
    )
    ledger.required = True
    p = ledger.add_parser(
        "init", help="create the ledger schema or migrate it", description=cmd_ledger_init.__doc__
    )
    url_arg(p)
    p.set_defaults(func=cmd_ledger_init)


def register_commands(subparsers: Any) -> None:
    """Add ``gpupool status``, ``reserve``, ``explain``, ``chain``, ``release`` and ``reap``.

    :param subparsers: the top-level subparsers
    """
    p = subparsers.add_parser(
        "status", help="show nodes, GPUs, grants and the queue", description=cmd_status.__doc__
    )
    url_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--kubeconfig",
        metavar="F",
        help="read the cluster's pods with this kubeconfig and show each node's drift (default: the ledger only)",
    )
    p.add_argument("--context", metavar="C", help="read the cluster's pods with this kubeconfig context")
    p.set_defaults(func=cmd_status)
    register_reserve(subparsers)
    p = subparsers.add_parser(
        "explain", help="why a request waits, and when it should start", description=cmd_explain.__doc__
    )
    url_arg(p)
    p.add_argument("id", type=non_empty, help="reservation id")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_explain)
    p = subparsers.add_parser(
        "chain", help="a DAG run's GPU steps as one chain (hand-ons, gaps)", description=cmd_chain.__doc__
    )
    url_arg(p)
    p.add_argument("dag_id", type=non_empty, help="the DAG")
    p.add_argument("run_id", type=non_empty, help="the DAG run")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_chain)
    p = subparsers.add_parser(
        "release", help="release a grant or withdraw a request", description=cmd_release.__doc__
    )
    url_arg(p)
    p.add_argument("id", type=non_empty, help="reservation id")
    p.add_argument("--reason", type=non_empty, default="released from the gpupool CLI")
    p.set_defaults(func=cmd_release)
    p = subparsers.add_parser(
        "reap", help="expire dead leases and overdue requests", description=cmd_reap.__doc__
    )
    url_arg(p)
    p.set_defaults(func=cmd_reap)
