"""`gpupool bench heartbeats`: what node agents cost the ledger, and what one agent costs its node.

Three phases, repeated ``rounds`` times, on a fresh ledger of ``nodes`` 8-GPU nodes (on PostgreSQL in a schema of its own,
``gpupool_heartbeat_bench_<pid>``, dropped afterwards; on SQLite in a new file):

1. **baseline**: ``clients`` processes run reserve → hold → release cycles for ``seconds``;
2. **paced**: the same load, plus heartbeats from every node at its ``interval`` (``nodes /
   interval`` per second in all, spread over ``writers`` processes), each a full 8-GPU report as
   the agent writes it: the ratio of cycles per second to the baseline is what heartbeats cost the
   grants, and the heartbeat latencies are what an agent waits;
3. **flood**: the same load, with the writers sending heartbeats as fast as they can: the
   heartbeats per second the ledger sustains next to the load.

And the agent itself: CPU time and memory of one sample + write of a fake 8-GPU node (the real
collector on the fake NVML), per interval. On a shared machine the absolute numbers are noisy;
compare the ratios measured in one run.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import random
import resource
import statistics
import time
import tracemalloc
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from airflow_gpupool.agent.collect import NvmlCollector
from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.ledger import Ledger, NodeReport
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.resources import GpuDevice, GpuRequest, NodeInventory
from airflow_gpupool.testing.fake_nvml import FakeNvml, node_spec

__all__ = ["measure_agent", "run_heartbeat_bench"]

_SHAPES = (
    GpuRequest(gpus=1, cpu_milli=8000, memory_mib=32768),
    GpuRequest(gpus=2, cpu_milli=16000, memory_mib=65536),
    GpuRequest(gpu_milli=250, cpu_milli=2000, memory_mib=8192),
)


def _inventory(count: int) -> list[NodeInventory]:
    return [
        NodeInventory(
            f"hb-{i:05d}",
            128000,
            1048576,
            tuple(GpuDevice(g, f"gpu-hb-{i}-{g}", "A100-SXM4-80GB", 81920) for g in range(8)),
        )
        for i in range(count)
    ]


def _report(node: str, interval: float, now: float) -> NodeReport:
    """An 8-GPU report as the agent makes it (the real collector on the fake NVML, busy GPUs)."""
    spec = node_spec(node, 8)
    for i, gpu in enumerate(spec["gpus"]):
        gpu.update(
            utilization={"gpu": 80, "memory": 40},
            temperature=60,
            ecc={"corrected": 0, "uncorrected": 0},
            processes=[{"pid": 1000 + i, "memory_mib": 30000, "pod_uid": None}],
        )
    fake = FakeNvml(spec)
    collector = NvmlCollector(fake, node, pod_uid_of=fake.pod_uid_of, clock=lambda: now)
    collector.open()
    try:
        return collector.sample(interval)
    finally:
        collector.close()


def _load_client(url: str, index: int, seconds: float, ready: Any, go: Any, out: Any) -> None:
    rng = random.Random(index)
    ledger = Ledger(url)
    ledger.reap()
    ready.put(index)
    go.wait()
    cycles = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        held = ledger.reserve(rng.choice(_SHAPES), f"bench-{index}", ttl=60, timeout=30)
        time.sleep(0.002)
        ledger.release(held.id)
        cycles += 1
    ledger.close()
    out.put({"cycles": cycles, "elapsed": time.perf_counter() - started})


def _heartbeat_writer(
    url: str, nodes: list[str], interval: float | None, seconds: float, ready: Any, go: Any, out: Any
) -> None:
    """Send the heartbeats of ``nodes``: each every ``interval`` s, or back to back when None."""
    ledger = Ledger(url)
    ledger.reap()
    reports = {n: _report(n, interval or 30.0, time.time()) for n in nodes}
    ready.put(len(nodes))
    go.wait()
    latencies: list[float] = []
    started = time.perf_counter()
    step = (interval / len(nodes)) if interval else 0.0
    k = 0
    while (now := time.perf_counter() - started) < seconds:
        if step and now < k * step:
            time.sleep(min(k * step - now, 0.05))
            continue
        t0 = time.perf_counter()
        ledger.record_report(reports[nodes[k % len(nodes)]], missed_heartbeats=3, leak_grace_seconds=60)
        latencies.append((time.perf_counter() - t0) * 1000)
        k += 1
    ledger.close()
    out.put({"latencies": latencies, "elapsed": time.perf_counter() - started})


def _gather(queue: Any, count: int, procs: list[Any], timeout: float = 600) -> list[Any]:
    items: list[Any] = []
    deadline = time.time() + timeout
    while len(items) < count:
        try:
            items.append(queue.get(timeout=0.5))
        except Exception:
            if any(p.exitcode not in (None, 0) for p in procs) or time.time() > deadline:
                for p in procs:
                    p.terminate()
                raise RuntimeError(
                    f"bench processes failed (exit codes {[p.exitcode for p in procs]})"
                ) from None
    return items


def _phase(
    url: str, names: list[str], clients: int, writers: int, interval: float | None, seconds: float
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    ready, load_out, beat_out, go = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_load_client, args=(url, i, seconds, ready, go, load_out)) for i in range(clients)
    ]
    shares = [names[w::writers] for w in range(writers)] if writers else []
    procs += [
        ctx.Process(target=_heartbeat_writer, args=(url, share, interval, seconds, ready, go, beat_out))
        for share in shares
    ]
    for p in procs:
        p.start()
    _gather(ready, len(procs), procs)
    go.set()
    loads = _gather(load_out, clients, procs)
    beats = _gather(beat_out, len(shares), procs)
    for p in procs:
        p.join()
    latencies = sorted(x for b in beats for x in b["latencies"])
    wall = max(r["elapsed"] for r in loads)
    out: dict[str, Any] = {"cycles_per_s": round(sum(r["cycles"] for r in loads) / wall, 1)}
    if beats:
        out["heartbeats_per_s"] = round(len(latencies) / max(b["elapsed"] for b in beats), 1)
        out["heartbeat_p50_ms"] = round(statistics.median(latencies), 2) if latencies else 0.0
        out["heartbeat_p99_ms"] = (
            round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2) if latencies else 0.0
        )
    return out


def measure_agent(url: str, passes: int = 20) -> dict[str, Any]:
    """CPU time and memory of one agent interval on a fake 8-GPU node: sample, then write the heartbeat."""
    ledger = Ledger(url)
    spec = node_spec("hb-00000", 8)
    for i, gpu in enumerate(spec["gpus"]):
        gpu["processes"] = [{"pid": 1000 + i, "memory_mib": 30000, "pod_uid": None}]
    fake = FakeNvml(spec)
    collector = NvmlCollector(fake, "hb-00000", pod_uid_of=fake.pod_uid_of)
    collector.open()
    ledger.record_report(collector.sample(30.0))  # warm: connections, schema check, caches
    gc.collect()
    cpu: list[float] = []
    peaks: list[int] = []
    for _ in range(passes):
        tracemalloc.start()
        t0 = time.thread_time()
        ledger.record_report(collector.sample(30.0))
        cpu.append((time.thread_time() - t0) * 1000)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    collector.close()
    ledger.close()
    return {
        "agent_cpu_ms_per_interval_p50": round(statistics.median(cpu), 2),
        "agent_cpu_ms_per_interval_max": round(max(cpu), 2),
        "agent_alloc_peak_kib_per_interval": round(statistics.median(peaks) / 1024, 1),
        "agent_process_max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "agent_cpu_share_at_30s": round(statistics.median(cpu) / 30_000, 6),
    }


def run_heartbeat_bench(
    url: str,
    *,
    nodes: int,
    interval: float,
    seconds: float,
    clients: int,
    writers: int,
    rounds_count: int = 3,
) -> dict[str, Any]:
    """Run the three phases and the agent measure; return their numbers (see the module docstring)."""
    schema = f"gpupool_heartbeat_bench_{os.getpid()}"
    parsed = make_url(normalize_url(url))
    postgres = parsed.get_backend_name() == "postgresql"
    if postgres:
        engine = create_engine(normalize_url(url))
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
        bench_url = parsed.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
            hide_password=False
        )
    else:
        if not parsed.database or os.path.exists(parsed.database):
            raise ConfigurationError(
                "bench heartbeats on SQLite needs a new file URL such as sqlite:////tmp/hb.db"
            )
        bench_url = normalize_url(url)
    try:
        ledger = Ledger.create(bench_url)
        ledger.upsert_nodes(_inventory(nodes))
        names = [f"hb-{i:05d}" for i in range(nodes)]
        # Each node's first heartbeat verifies its UUIDs (once per agent start, under the ledger's
        # lock); the phases measure the steady state that follows.
        first: list[float] = []
        for name in names:
            report = _report(name, interval, time.time())
            t0 = time.perf_counter()
            ledger.record_report(report)
            first.append((time.perf_counter() - t0) * 1000)
        ledger.close()
        result: dict[str, Any] = {
            "backend": parsed.get_backend_name(),
            "nodes": nodes,
            "interval_s": interval,
        }
        result["first_heartbeat_p50_ms"] = round(statistics.median(first), 2)
        result["offered_heartbeats_per_s"] = round(nodes / interval, 1)
        # Phases interleaved, round after round: on a shared machine the load of the moment moves
        # every number; a ratio within a round, and the median over rounds, moves much less.
        rounds: list[dict[str, Any]] = []
        for _ in range(max(1, rounds_count)):
            one = {
                "baseline": _phase(bench_url, names, clients, 0, None, seconds),
                "paced": _phase(bench_url, names, clients, writers, interval, seconds),
                "flood": _phase(bench_url, names, clients, writers, None, seconds),
            }
            base = one["baseline"]["cycles_per_s"] or 1.0
            one["paced_cycles_ratio"] = round(one["paced"]["cycles_per_s"] / base, 3)
            one["flood_cycles_ratio"] = round(one["flood"]["cycles_per_s"] / base, 3)
            rounds.append(one)
        result["rounds"] = rounds
        for key in ("paced_cycles_ratio", "flood_cycles_ratio"):
            result[f"median_{key}"] = statistics.median(r[key] for r in rounds)
        for phase, key in (
            ("paced", "heartbeat_p50_ms"),
            ("paced", "heartbeat_p99_ms"),
            ("flood", "heartbeats_per_s"),
        ):
            result[f"median_{phase}_{key}"] = statistics.median(r[phase][key] for r in rounds)
        result["agent"] = measure_agent(bench_url)
        result["cpu_count"] = os.cpu_count()
        return result
    finally:
        if postgres:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            engine.dispose()
