"""``gpupool ledger init``, ``status``, ``reserve``, ``release`` and ``reap``: the ledger by hand."""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import TYPE_CHECKING, Any

from airflow_gpupool.argtypes import integer, key_value, non_empty, number
from airflow_gpupool.cli.common import open_ledger, print_json, table, url_arg

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow_gpupool.ledger import LedgerSnapshot, QuotaUse, Reservation

__all__ = [
    "cmd_ledger_init",
    "cmd_reap",
    "cmd_release",
    "cmd_reserve",
    "cmd_status",
    "format_status",
    "register_commands",
    "register_group",
]


def cmd_ledger_init(args: argparse.Namespace) -> int:
    """Create or migrate the ledger schema."""
    ledger = open_ledger(args, must_exist=False)
    applied = ledger.migrate()
    print(
        f"ledger at {ledger.display_url}: "
        + (f"applied schema {', '.join(f'v{v}' for v in applied)}" if applied else "already up to date")
    )
    return 0


# -- status -----------------------------------------------------------------------------------


def _gpu_cell(gpu: dict[str, Any]) -> str:
    if gpu["partitioned"]:
        return f"{gpu['idx']}:MIG"
    return f"{gpu['idx']}:{gpu['free_milli'] / 1000:.2f}"


def format_status(snapshot: LedgerSnapshot, quotas: Sequence[QuotaUse] = ()) -> str:
    """Render a ledger snapshot as the tables `gpupool status` prints.

    :param snapshot: the ledger's snapshot
    :param quotas: the stored quotas beside their teams' use (no table when none is stored)
    """
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
        ]
        for r in snapshot.queue
    ]
    out.append(f"\nQueue ({len(queue_rows)})")
    out.append(
        table(["POS", "ID", "HOLDER", "PRIO", "ASKS", "WAITING"], queue_rows) if queue_rows else "  empty"
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


def cmd_status(args: argparse.Namespace) -> int:
    """Print nodes, GPUs, free capacity, grants, the queue and the quotas' use."""
    from airflow_gpupool.ledger import quota_uses

    ledger = open_ledger(args)
    snapshot = ledger.snapshot()
    quotas = quota_uses(ledger, snapshot)
    if args.json:
        print_json({**snapshot.to_dict(), "quotas": [u.to_dict() for u in quotas]})
    else:
        print(format_status(snapshot, quotas))
    return 0


# -- reserve / release / reap ----------------------------------------------------------------------


def cmd_reserve(args: argparse.Namespace) -> int:
    """Reserve a slice by hand (debugging a pool)."""
    from airflow_gpupool.resources import GpuRequest, WorkloadClass

    request = GpuRequest(
        cpu_milli=args.cpu_milli,
        memory_mib=args.memory_mib,
        gpus=args.gpus,
        gpu_milli=args.gpu_milli,
        gpu_memory_mib=args.gpu_memory_mib,
        mig_profile=args.mig_profile,
        gpu_models=frozenset(args.gpu_model or ()),
        node_labels=tuple(args.label or ()),
        workload_class=WorkloadClass(args.workload_class),
        priority=args.priority,
        team=args.team,
    )
    # The id is made here, before anything is sent: a reserve that fails without an answer
    # (the ledger unreachable) can be checked, or run again with the same --id.
    reservation_id = args.id or uuid.uuid4().hex
    if not args.id:
        print(f"gpupool: reservation id {reservation_id}", file=sys.stderr)
    reservation = open_ledger(args).reserve(
        request, args.holder, ttl=args.ttl, timeout=args.timeout, reservation_id=reservation_id
    )
    if args.json:
        print_json(reservation.to_dict())
    elif reservation.grant:
        g = reservation.grant
        print(
            f"{reservation.id} granted on {g.node} GPUs {list(g.gpu_indices)}"
            + (f" slice {g.mig_slice}" if g.mig_slice else "")
        )
    else:
        print(f"{reservation.id} {reservation.state.value}, position {reservation.position} in the queue")
    return 0


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
    """Add ``gpupool status``, ``reserve``, ``release`` and ``reap``.

    :param subparsers: the top-level subparsers
    """
    p = subparsers.add_parser(
        "status", help="show nodes, GPUs, grants and the queue", description=cmd_status.__doc__
    )
    url_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_status)
    _reserve_parser(subparsers)
    p = subparsers.add_parser(
        "release", help="release a grant or withdraw a request", description=cmd_release.__doc__
    )
    url_arg(p)
    p.add_argument("id", type=non_empty, help="reservation id")
    p.add_argument("--reason", default="released from the gpupool CLI")
    p.set_defaults(func=cmd_release)
    p = subparsers.add_parser(
        "reap", help="expire dead leases and overdue requests", description=cmd_reap.__doc__
    )
    url_arg(p)
    p.set_defaults(func=cmd_reap)


def _reserve_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("reserve", help="reserve a GPU slice by hand", description=cmd_reserve.__doc__)
    url_arg(p)
    part = p.add_mutually_exclusive_group()
    part.add_argument("--gpus", type=integer(0), default=0, help="whole GPUs")
    part.add_argument("--gpu-milli", type=integer(1, 999), help="a fraction of one GPU, 1-999 milli-GPU")
    part.add_argument("--mig-profile", type=non_empty, help="a MIG profile such as 1g.10gb")
    p.add_argument("--gpu-memory-mib", type=integer(1), help="GPU memory for a fraction")
    p.add_argument("--gpu-model", type=non_empty, action="append", help="allowed GPU model (repeatable)")
    p.add_argument(
        "--label", type=key_value, action="append", help="required node label key=value (repeatable)"
    )
    p.add_argument("--cpu-milli", type=integer(0), default=1000)
    p.add_argument("--memory-mib", type=integer(0), default=1024)
    p.add_argument("--workload-class", default="batch", choices=["training", "inference", "batch"])
    p.add_argument("--priority", type=integer(), default=0)
    p.add_argument("--team", type=non_empty, default="default")
    p.add_argument("--holder", type=non_empty, default="gpupool-cli", help="who holds it")
    p.add_argument("--ttl", type=number(0, above=True), help="lease seconds")
    p.add_argument("--timeout", type=number(0, above=True), help="seconds it may wait in the queue")
    p.add_argument(
        "--id", type=non_empty, help="reservation id (idempotent); made and printed on stderr when not given"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_reserve)
