"""`gpupool bench ledger`: reserve → hold → release cycles from many processes at once.

Creates a fresh ledger (on PostgreSQL in a schema of its own, ``gpupool_bench_<pid>``, dropped
afterwards, so the database's real ledger is untouched; on SQLite in the file given,
which must not exist yet), loads an inventory of ``nodes`` nodes, runs ``clients``
processes for ``seconds`` and checks the invariants during and after the run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db.engine import normalize_url, transient_retry
from airflow_gpupool.resources import GpuDevice, GpuRequest, MigSlice, NodeInventory, WorkloadClass

#: Mixed request shapes: whole GPUs, fractions (with and without GPU memory) and MIG slices.
SHAPES = (
    GpuRequest(gpus=1, cpu_milli=8000, memory_mib=32768),
    GpuRequest(gpus=2, cpu_milli=16000, memory_mib=65536, workload_class=WorkloadClass.TRAINING),
    GpuRequest(gpu_milli=250, cpu_milli=2000, memory_mib=8192, workload_class=WorkloadClass.INFERENCE),
    GpuRequest(gpu_milli=500, gpu_memory_mib=20480, cpu_milli=4000, memory_mib=16384),
    GpuRequest(mig_profile="1g.10gb", cpu_milli=2000, memory_mib=8192),
    GpuRequest(
        mig_profile="3g.40gb", cpu_milli=4000, memory_mib=16384, workload_class=WorkloadClass.TRAINING
    ),
)


def bench_inventory(count: int) -> list[NodeInventory]:
    """Return ``count`` nodes: A100 x8, A100 x8 with two MIG-partitioned GPUs, T4 x4."""
    nodes = []
    for i in range(count):
        kind = i % 5
        if kind == 4:
            gpus = tuple(GpuDevice(g, f"GPU-b{i}-{g}", "T4", 15360) for g in range(4))
            pool = "t4"
        else:
            gpus = tuple(
                GpuDevice(
                    g,
                    f"GPU-b{i}-{g}",
                    "A100-SXM4-80GB",
                    81920,
                    tuple(
                        MigSlice(f"g{g}-m{k}", p)
                        for k, p in enumerate(("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"))
                    )
                    if kind == 3 and g < 2
                    else (),
                )
                for g in range(8)
            )
            pool = "a100-mig" if kind == 3 else "a100"
        nodes.append(NodeInventory(f"bench-{i:05d}", 128000, 1048576, gpus, node_pool=pool))
    return nodes


def fresh_bench_url(url: str, bench_schema: str) -> str:
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":
        return parsed.update_query_dict({"options": f"-csearch_path={bench_schema}"}).render_as_string(
            hide_password=False
        )
    path = parsed.database
    if not path or path == ":memory:":
        raise ConfigurationError("bench ledger on SQLite needs a file URL such as sqlite:////tmp/bench.db")
    if Path(path).exists():
        raise ConfigurationError(f"{path} exists: the benchmark creates a fresh ledger; give a new file")
    return url


@transient_retry  # a URL the server turns away says so, typed, instead of a driver's traceback
def pg_bench_schema(url: str, bench_schema: str, create: bool) -> None:
    engine = create_engine(normalize_url(url))
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {bench_schema} CASCADE")
        if create:
            conn.exec_driver_sql(f"CREATE SCHEMA {bench_schema}")
    engine.dispose()


def _client(
    url: str, index: int, seconds: float, hold_s: float, concurrent: bool, ready: Any, go: Any, out: Any
) -> None:
    rng = random.Random(index)
    ledger = Ledger(url, concurrent=concurrent)
    ledger.reap()  # connect, check the schema and load the capacity cache before the clock starts
    ready.put(index)
    go.wait()
    reserve_ms: list[float] = []
    release_ms: list[float] = []
    queued = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        request = rng.choice(SHAPES)
        t0 = time.perf_counter()
        reservation = ledger.reserve(request, f"bench-client-{index}", ttl=60, timeout=30)
        reserve_ms.append((time.perf_counter() - t0) * 1000)
        if reservation.state is not ReservationState.GRANTED:
            queued += 1
        time.sleep(hold_s)
        t0 = time.perf_counter()
        ledger.release(reservation.id)
        release_ms.append((time.perf_counter() - t0) * 1000)
    elapsed = time.perf_counter() - started
    ledger.close()
    out.put({"reserve_ms": reserve_ms, "release_ms": release_ms, "queued": queued, "elapsed": elapsed})


def gather(queue: Any, procs: list[Any], timeout: float = 300) -> list[Any]:
    """Take one item per process from ``queue``; fail at once if a process died instead."""
    items: list[Any] = []
    deadline = time.time() + timeout
    while len(items) < len(procs):
        try:
            items.append(queue.get(timeout=0.5))
        except Exception:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead or time.time() > deadline:
                for p in procs:
                    p.terminate()
                raise RuntimeError(
                    f"bench clients failed (exit codes {[p.exitcode for p in procs]})"
                ) from None
    return items


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_ledger_bench(
    url: str,
    *,
    clients: int,
    seconds: float,
    nodes: int,
    hold_ms: float = 2.0,
    concurrent: bool = True,
    beside: Callable[[str, Any, Any, Any], None] | None = None,
) -> dict[str, Any]:
    """Run the benchmark and return its numbers (see the module docstring).

    :param concurrent: False makes every PostgreSQL write take the exclusive lock
    :param beside: run in a process of its own during the measured window, given the bench
        ledger's URL, a queue to put one item on once warm, the event that starts the window and
        one set when it ends (``gpupool bench forecast``'s forecaster)
    """
    bench_schema = f"gpupool_bench_{os.getpid()}"  # two benches on one database don't collide
    bench_url = fresh_bench_url(url, bench_schema)
    backend = make_url(bench_url).get_backend_name()
    if backend == "postgresql":
        pg_bench_schema(url, bench_schema, create=True)
    try:
        ledger = Ledger.create(bench_url)
        ledger.upsert_nodes(bench_inventory(nodes))
        ctx = mp.get_context("spawn")
        ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        procs = [
            ctx.Process(
                target=_client, args=(bench_url, i, seconds, hold_ms / 1000, concurrent, ready, go, out)
            )
            for i in range(clients)
        ]
        stop = ctx.Event()
        extra = ctx.Process(target=beside, args=(bench_url, ready, go, stop)) if beside is not None else None
        for p in procs + ([extra] if extra is not None else []):
            p.start()
        # Every client (and the process beside) connected and warm: only then does the clock start.
        gather(ready, procs + ([extra] if extra is not None else []))
        go.set()
        samples, violations = 0, []
        deadline = time.time() + seconds
        while time.time() < deadline:
            violations += ledger.check_invariants()
            samples += 1
            time.sleep(min(1.0, max(0.0, deadline - time.time())))
        results = gather(out, procs)
        stop.set()
        for p in procs + ([extra] if extra is not None else []):
            p.join()
        violations += ledger.check_invariants()
        leaked = len(ledger.snapshot().grants)
        ledger.close()
    finally:
        if backend == "postgresql":
            pg_bench_schema(url, bench_schema, create=False)
    reserve = [x for r in results for x in r["reserve_ms"]]
    release = [x for r in results for x in r["release_ms"]]
    cycles = len(release)
    wall = max(r["elapsed"] for r in results)
    return {
        "backend": backend,
        "path": "concurrent" if concurrent and backend == "postgresql" else "serialized",
        "clients": clients,
        "nodes": nodes,
        "seconds": round(wall, 2),
        "cycles": cycles,
        "cycles_per_s": round(cycles / wall, 1),
        "reserve_p50_ms": round(statistics.median(reserve), 2) if reserve else 0.0,
        "reserve_p99_ms": round(percentile(reserve, 0.99), 2),
        "release_p50_ms": round(statistics.median(release), 2) if release else 0.0,
        "release_p99_ms": round(percentile(release, 0.99), 2),
        "queued": sum(r["queued"] for r in results),
        "invariant_samples": samples + 1,
        "violations": len(violations),
        "violation_examples": violations[:5],
        "grants_left": leaked,
        "cpu_count": os.cpu_count(),
    }
