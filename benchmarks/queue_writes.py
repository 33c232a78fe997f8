"""Queue writes: how many writes take the ledger's exclusive lock, and how long they take, per waiter granted.

`gpupool bench queue` measures what clients lose to 1,000 waiters on a shared, noisy machine
(two runs of one tree differ by a factor 1.3). This script counts instead, in one process and
in a fixed order, the writes behind that loss: the same pool and load as the bench (32 nodes of
8 A100 held but one GPU each, N whole-node requests waiting), then ``--cycles`` client cycles
(reserve one GPU or half of one, release), and every ``--every`` cycles the bench's node freeing
followed by one new whole-node request for each waiter granted (what the triggerer's process
does). Each call is classed by whether it took the exclusive lock (``pg_advisory_xact_lock`` on
PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite: every SQLite write) and timed.

Usage (``PYTHONPATH`` names the tree to measure, so two trees compare in one session)::

    PYTHONPATH=. python benchmarks/queue_writes.py --url postgresql://postgres@127.0.0.1:5432/test_queue
    PYTHONPATH=. python benchmarks/queue_writes.py --url sqlite:////tmp/qw.db
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict
from typing import Any

from sqlalchemy import event, select

from airflow_gpupool.bench import queue_bench as bench
from airflow_gpupool.bench.ledger_bench import fresh_bench_url, pg_bench_schema
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.ledger.db import schema


def _exclusive(statement: str) -> bool:
    return "pg_advisory_xact_lock(" in statement or statement.strip().upper().startswith("BEGIN IMMEDIATE")


def run(url: str, waiters: int, cycles: int, every: int) -> dict[str, Any]:
    """Run the load and return the writes counted and timed, per kind of call."""
    bench_schema = "gpupool_queue_writes"
    bench_url = fresh_bench_url(url, bench_schema)
    postgres = bench_url.startswith("postgresql")
    if postgres:
        pg_bench_schema(url, bench_schema, create=True)
    setup = Ledger.create(bench_url)
    setup.upsert_nodes(bench._inventory(32))  # the bench's own helpers: the same pool and queue
    fillers = bench._fill(setup, 32)
    bench._queue_waiters(setup, waiters)
    client = Ledger(bench_url)
    client.reap()
    locked = [0]

    def count(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        locked[0] += _exclusive(statement)

    for ledger in (client, setup):
        event.listen(ledger._store.engine, "before_cursor_execute", count)
    calls: dict[str, list[float]] = defaultdict(list)

    def timed(kind: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        before, started = locked[0], time.perf_counter()
        result = call(*args, **kwargs)
        path = "exclusive" if locked[0] > before else "shared or none"
        calls[f"{kind} ({path})"].append(time.perf_counter() - started)
        return result

    r = schema.reservations.c
    granted_query = select(r.id).where(r.holder == "bench-waiter", r.state != "waiting")
    rng, made = random.Random(1), 0
    granted_nodes: list[str] = []
    seen: set[str] = set()
    started = time.perf_counter()
    for i in range(cycles):
        reservation = timed("client reserve", client.reserve, rng.choice(bench.CLIENT_SHAPES), "c", ttl=60)
        timed("client release", client.release, reservation.id)
        if waiters and i % every == 0:
            timed("bench frees a node", bench._free_a_node, setup, fillers, granted_nodes)
            now = set(setup.read(lambda conn: conn.execute(granted_query).scalars().all()))
            for _ in now - seen:
                made += 1
                timed("new waiting request", setup.reserve, bench.WAITER_SHAPE, "bench-waiter", ttl=3600)
            seen = now
    wall = time.perf_counter() - started
    client.close()
    setup.close()
    if postgres:
        pg_bench_schema(url, bench_schema, create=False)
    return {
        "waiters": waiters,
        "cycles": cycles,
        "cycles_per_s": round(cycles / wall, 1),
        "waiters_granted": made,
        "exclusive_writes": locked[0],
        "calls": {
            kind: {"n": len(t), "mean_ms": round(1000 * sum(t) / len(t), 2)} for kind, t in calls.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="a PostgreSQL database or a new SQLite file")
    parser.add_argument("--waiters", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=400)
    parser.add_argument("--every", type=int, default=10, help="client cycles between two node frees")
    args = parser.parse_args()
    print(json.dumps(run(args.url, args.waiters, args.cycles, args.every), indent=2))


if __name__ == "__main__":
    main()
