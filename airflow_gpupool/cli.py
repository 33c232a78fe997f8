"""The ``gpupool`` command: ledger administration, status, debugging and benchmarks.

The ledger URL comes from ``--url``, else ``GPUPOOL_LEDGER_URL``, else ``[gpupool] ledger_url``,
else a SQLite file under ``AIRFLOW_HOME``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from airflow_gpupool import settings
from airflow_gpupool.exceptions import GpuPoolError

log = logging.getLogger("gpupool")


def _ledger(args: argparse.Namespace, create: bool = False) -> Any:
    from airflow_gpupool.ledger import Ledger

    url = settings.ledger_url(getattr(args, "url", None))
    return Ledger.create(url) if create else Ledger(url)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


# -- ledger / inventory -----------------------------------------------------------------------


def cmd_ledger_init(args: argparse.Namespace) -> int:
    """Create or migrate the ledger schema."""
    ledger = _ledger(args)
    applied = ledger.migrate()
    print(
        f"ledger at {ledger.url}: "
        + (f"applied schema {', '.join(f'v{v}' for v in applied)}" if applied else "already up to date")
    )
    return 0


def cmd_inventory_load(args: argparse.Namespace) -> int:
    """Load a static YAML inventory into the ledger."""
    from airflow_gpupool.inventory import load_inventory

    nodes = load_inventory(args.file)
    ledger = _ledger(args, create=args.init)
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


# -- status -----------------------------------------------------------------------------------


def _gpu_cell(gpu: dict[str, Any]) -> str:
    if gpu["partitioned"]:
        return f"{gpu['idx']}:MIG"
    return f"{gpu['idx']}:{gpu['free_milli'] / 1000:.2f}"


def format_status(snapshot: Any) -> str:
    """Render a ledger snapshot as the tables `gpupool status` prints."""
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
        _table(
            ["NODE", "POOL", "HEALTH", "GPUS", "FREE PER GPU", "FREE MIG", "CPU FREE", "MEM FREE GiB"], rows
        )
    )
    now = snapshot.taken_at
    grant_rows = []
    for r in snapshot.grants:
        g = r.grant
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
                f"{g.expires_at - now:.0f}s",
            ]
        )
    out.append(f"\nGrants ({len(grant_rows)})")
    out.append(
        _table(["ID", "HOLDER", "TEAM", "SLICE", "WHERE", "LEASE LEFT"], grant_rows)
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
        _table(["POS", "ID", "HOLDER", "PRIO", "ASKS", "WAITING"], queue_rows) if queue_rows else "  empty"
    )
    return "\n".join(out)


def snapshot_to_dict(snapshot: Any) -> dict[str, Any]:
    """Return a ledger snapshot as JSON-ready primitives."""
    return {
        "taken_at": snapshot.taken_at,
        "gpu_capacity_milli": snapshot.gpu_capacity_milli,
        "gpu_allocated_milli": snapshot.gpu_allocated_milli,
        "allocation": snapshot.allocation,
        "nodes": [
            {
                "name": n.name,
                "node_pool": n.node_pool,
                "health": n.health,
                "labels": n.labels,
                "cpu_milli": n.cpu_milli,
                "cpu_free": n.cpu_free,
                "memory_mib": n.memory_mib,
                "memory_free": n.memory_free,
                "heartbeat_at": n.heartbeat_at,
                "gpus": [{k: v for k, v in g.items() if k != "node"} for g in n.gpus],
            }
            for n in snapshot.nodes
        ],
        "grants": [r.to_dict() for r in snapshot.grants],
        "queue": [r.to_dict() for r in snapshot.queue],
    }


def cmd_status(args: argparse.Namespace) -> int:
    """Print nodes, GPUs, free capacity, grants and the queue."""
    snapshot = _ledger(args).snapshot()
    if args.json:
        _print_json(snapshot_to_dict(snapshot))
    else:
        print(format_status(snapshot))
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
        node_labels=tuple(_label(x) for x in args.label or ()),
        workload_class=WorkloadClass(args.workload_class),
        priority=args.priority,
        team=args.team,
    )
    reservation = _ledger(args).reserve(
        request, args.holder, ttl=args.ttl, timeout=args.timeout, reservation_id=args.id
    )
    if args.json:
        _print_json(reservation.to_dict())
    elif reservation.grant:
        g = reservation.grant
        print(
            f"{reservation.id} granted on {g.node} GPUs {list(g.gpu_indices)}"
            + (f" slice {g.mig_slice}" if g.mig_slice else "")
        )
    else:
        print(f"{reservation.id} {reservation.state.value}, position {reservation.position} in the queue")
    return 0


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"label {text!r} is not key=value")
    return key, value


def cmd_release(args: argparse.Namespace) -> int:
    """Release a grant or withdraw a waiting request."""
    result = _ledger(args).release(args.id, reason=args.reason)
    print(result.message)
    return 0


def cmd_reap(args: argparse.Namespace) -> int:
    """Expire dead leases and overdue requests, then serve the queue."""
    result = _ledger(args).reap()
    print(f"expired {len(result.expired)}, timed out {len(result.timed_out)}, granted {len(result.granted)}")
    return 0


def cmd_bench_ledger(args: argparse.Namespace) -> int:
    """Measure ledger throughput and check its invariants under contention."""
    from airflow_gpupool.bench.ledger_bench import run_ledger_bench

    url = settings.ledger_url(args.url)
    result = run_ledger_bench(
        url,
        clients=args.clients,
        seconds=args.seconds,
        nodes=args.nodes,
        hold_ms=args.hold_ms,
        concurrent=not args.serialized,
    )
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:>20}: {value}")
    return 1 if result["violations"] else 0


# -- parser -------------------------------------------------------------------------------------


def _url_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help="ledger URL (default: GPUPOOL_LEDGER_URL, [gpupool] ledger_url, or SQLite under AIRFLOW_HOME)",
    )


def _reserve_parser(sub: Any) -> None:
    p = sub.add_parser("reserve", help="reserve a GPU slice by hand", description=cmd_reserve.__doc__)
    _url_arg(p)
    part = p.add_mutually_exclusive_group()
    part.add_argument("--gpus", type=int, default=0, help="whole GPUs")
    part.add_argument("--gpu-milli", type=int, help="a fraction of one GPU, 1-999 milli-GPU")
    part.add_argument("--mig-profile", help="a MIG profile such as 1g.10gb")
    p.add_argument("--gpu-memory-mib", type=int, help="GPU memory for a fraction")
    p.add_argument("--gpu-model", action="append", help="allowed GPU model (repeatable)")
    p.add_argument("--label", action="append", help="required node label key=value (repeatable)")
    p.add_argument("--cpu-milli", type=int, default=1000)
    p.add_argument("--memory-mib", type=int, default=1024)
    p.add_argument("--workload-class", default="batch", choices=["training", "inference", "batch"])
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--team", default="default")
    p.add_argument("--holder", default="gpupool-cli", help="who holds it")
    p.add_argument("--ttl", type=float, help="lease seconds")
    p.add_argument("--timeout", type=float, help="seconds it may wait in the queue")
    p.add_argument("--id", help="reservation id (idempotent)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_reserve)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``gpupool`` command."""
    parser = argparse.ArgumentParser(
        prog="gpupool", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    ledger = sub.add_parser("ledger", help="create or migrate the ledger").add_subparsers(
        dest="ledger_command", metavar="ACTION"
    )
    ledger.required = True
    p = ledger.add_parser(
        "init", help="create the ledger schema or migrate it", description=cmd_ledger_init.__doc__
    )
    _url_arg(p)
    p.set_defaults(func=cmd_ledger_init)

    inventory = sub.add_parser("inventory", help="load nodes into the ledger").add_subparsers(
        dest="inventory_command", metavar="ACTION"
    )
    inventory.required = True
    p = inventory.add_parser(
        "load", help="load a static YAML inventory", description=cmd_inventory_load.__doc__
    )
    p.add_argument("file", help="inventory YAML (see README, 'Static inventory')")
    p.add_argument("--prune", action="store_true", help="remove (or drain) ledger nodes absent from the file")
    p.add_argument(
        "--no-init", dest="init", action="store_false", help="fail if the ledger does not exist yet"
    )
    _url_arg(p)
    p.set_defaults(func=cmd_inventory_load)
    _register_optional(inventory, "airflow_gpupool.inventory.kubernetes", "register_sync")

    p = sub.add_parser(
        "status", help="show nodes, GPUs, grants and the queue", description=cmd_status.__doc__
    )
    _url_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_status)

    _reserve_parser(sub)
    p = sub.add_parser(
        "release", help="release a grant or withdraw a request", description=cmd_release.__doc__
    )
    _url_arg(p)
    p.add_argument("id", help="reservation id")
    p.add_argument("--reason", default="released from the gpupool CLI")
    p.set_defaults(func=cmd_release)
    p = sub.add_parser("reap", help="expire dead leases and overdue requests", description=cmd_reap.__doc__)
    _url_arg(p)
    p.set_defaults(func=cmd_reap)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench_command", metavar="WHAT")
    bench.required = True
    p = bench.add_parser(
        "ledger",
        help="ledger throughput and invariants under contention",
        description=cmd_bench_ledger.__doc__,
    )
    _url_arg(p)
    p.add_argument("--clients", type=int, default=16, help="concurrent client processes")
    p.add_argument("--seconds", type=float, default=10, help="measured duration")
    p.add_argument("--nodes", type=int, default=1000, help="nodes in the bench inventory")
    p.add_argument("--hold-ms", type=float, default=2.0, help="how long each grant is held")
    p.add_argument(
        "--serialized",
        action="store_true",
        help="on PostgreSQL, every write takes the exclusive lock (for comparison with the concurrent path)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_bench_ledger)
    _register_optional(bench, "airflow_gpupool.bench.operator_bench", "register")

    for module, name in (
        ("airflow_gpupool.sim.command", "register"),
        ("airflow_gpupool.testing.emulator", "register"),
        ("airflow_gpupool.inventory.kubernetes", "register_reconcile"),
        ("airflow_gpupool.metrics.command", "register"),
    ):
        _register_optional(sub, module, name)
    return parser


def _register_optional(sub: Any, module: str, name: str) -> None:
    # Commands of parts that import heavier packages register themselves when present.
    import importlib

    try:
        register = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return
    register(sub)


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


if __name__ == "__main__":
    sys.exit(main())
