"""``gpupool bench forecast``: the CPU one forecast pass costs, on a full cluster with a long queue.

The state is synthetic and seeded: ``nodes`` nodes of :func:`~airflow_gpupool.bench.ledger_bench.bench_inventory`
(A100 x8, some MIG-partitioned, T4 x4), filled by running grants of 1, 2, 4 or 8 GPUs or a
fraction placed by the ledger's default policy until nothing more fits, and ``waiting``
requests of the same shapes behind them. Run times come from the prior (no history), so every
replay draws every remaining time. The pass timed is :func:`~airflow_gpupool.forecast.replay.forecast_starts`,
the controller's replay, in process CPU seconds.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from airflow_gpupool.bench.ledger_bench import bench_inventory
from airflow_gpupool.forecast.durations import DurationModel, TaskKey
from airflow_gpupool.forecast.replay import SAMPLES, Running, Waiting, forecast_starts
from airflow_gpupool.governance.victim_nodes import PreemptionRules
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.placement.accounting import allocate
from airflow_gpupool.placement.policy import get_policy
from airflow_gpupool.placement.snapshot import ClusterSnapshot
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.sim.replay import quick

__all__ = ["FORECASTER_EVERY_S", "forecast_state", "ledger_cycles_beside_forecaster", "run_forecast_bench"]

_SHAPES = (
    {"gpus": 1},
    {"gpus": 2},
    {"gpus": 4},
    {"gpus": 8},
    {"gpu_milli": 500, "gpu_memory_mib": 20480},
)


def forecast_state(nodes: int, waiting: int, seed: int = 42) -> dict[str, Any]:
    """Return :func:`forecast_starts`'s arguments for a full cluster of ``nodes`` and ``waiting`` requests."""
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger.create(f"sqlite:///{Path(tmp) / 'bench.db'}")
        try:
            ledger.upsert_nodes(bench_inventory(nodes))
            empty = list(ledger.empty_cluster().nodes)
            policy = ledger.policy
        finally:
            ledger.close()
    place = quick(policy if not isinstance(policy, str) else get_policy(policy))
    model = DurationModel(prior_seconds=3600.0)
    key = TaskKey(None, None, "bench", "batch")
    current = list(empty)
    where = {n.name: i for i, n in enumerate(current)}
    running: list[Running] = []
    misses = 0
    while misses < 20:  # fill until 20 draws in a row fit nowhere
        request = GpuRequest(**_SHAPES[int(rng.integers(len(_SHAPES)))])  # type: ignore[arg-type]
        verdict = place(ClusterSnapshot(tuple(current)), request)
        if not isinstance(verdict, Assignment):
            misses += 1
            continue
        misses = 0
        i = where[verdict.node]
        current[i] = allocate(current[i], request, verdict)
        running.append(Running(f"run-{len(running)}", request, verdict, model.sampler(key, 600.0)))
    queue = [
        Waiting(f"wait-{j}", GpuRequest(**_SHAPES[int(rng.integers(len(_SHAPES)))]), model.sampler(key))  # type: ignore[arg-type]
        for j in range(waiting)
    ]
    return {"nodes": current, "empty": empty, "running": running, "waiting": queue, "place": place}


def run_forecast_bench(nodes: int, waiting: int, samples: int = SAMPLES, seed: int = 42) -> dict[str, Any]:
    """Time one forecast pass; return its CPU seconds and what it forecast.

    :param nodes: nodes in the cluster
    :param waiting: requests waiting
    :param samples: replays in the pass
    :param seed: the state's seed
    """
    state = forecast_state(nodes, waiting, seed)
    started_cpu, started_wall = time.process_time(), time.perf_counter()
    forecasts = forecast_starts(
        time.time(),
        state["nodes"],
        state["empty"],
        state["running"],
        state["waiting"],
        state["place"],
        8,
        samples=samples,
        # The controller's rules: with no preemptible grant running, preemption costs one check per event.
        preemption=PreemptionRules(min_runtime_seconds=60.0, grace_seconds=120.0),
    )
    cpu = time.process_time() - started_cpu
    wall = time.perf_counter() - started_wall
    statuses: dict[str, int] = {}
    for f in forecasts:
        statuses[f.status] = statuses.get(f.status, 0) + 1
    return {
        "nodes": nodes,
        "waiting": waiting,
        "running": len(state["running"]),
        "samples": samples,
        "pass_cpu_s": round(cpu, 3),
        "pass_wall_s": round(wall, 3),
        "statuses": statuses,
    }


#: The forecaster's default cadence in the bench: the controller's default ``forecast_interval_seconds``.
FORECASTER_EVERY_S = 30.0


def _forecaster(every_s: float, passes: Any, url: str, ready: Any, go: Any, stop: Any) -> None:
    """Run the controller's forecast step on the ledger at ``url`` every ``every_s`` from ``go`` to ``stop``.

    The step is :class:`~airflow_gpupool.forecast.step.Forecaster`, as the controller calls it
    (it refreshes only when the queue, the grants or the nodes changed, which under the ledger
    bench is every time but while nothing waits). Puts ``(passes that ran, wall seconds of every
    call, skipped ones included)`` on ``passes`` at the end.
    """
    from airflow_gpupool.forecast.step import Forecaster

    ledger = Ledger(url)
    step = Forecaster(ledger)
    count, spent = 0, 0.0
    try:
        ledger.snapshot()  # connected and its imports done before the clock starts
        ready.put("forecaster")
        go.wait()
        while not stop.is_set():
            started = time.monotonic()
            if step() is not None:
                count += 1
            spent += time.monotonic() - started
            stop.wait(max(0.0, every_s - (time.monotonic() - started)))
    finally:
        ledger.close()
        passes.put((count, spent))


def _phase_urls(url: str, rounds: int) -> list[str]:
    """Return one ledger URL per phase: on SQLite a new file beside ``url`` each (``.1``, ``.2`` ...)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":  # the ledger bench makes a fresh schema per run
        return [url] * (2 * rounds)
    return [
        parsed.set(database=f"{parsed.database}.{k}").render_as_string(False)
        for k in range(1, 2 * rounds + 1)
    ]


def ledger_cycles_beside_forecaster(
    url: str,
    *,
    seconds: float,
    nodes: int,
    clients: int = 8,
    every_s: float = FORECASTER_EVERY_S,
    rounds: int = 1,
) -> dict[str, Any]:
    """Return the ledger bench's cycle rate without and with a forecaster beside it, phases alternating.

    Each round runs :func:`~airflow_gpupool.bench.ledger_bench.run_ledger_bench` (``clients``,
    ``seconds``) twice on a fresh ledger of ``nodes`` nodes at ``url`` (on SQLite, new files
    beside it): first alone (A), then with a process running the controller's forecast step every
    ``every_s`` seconds (B), the pass's reads, replays and write included; ``rounds`` rounds give
    A, B, A, B ... so the machine's drift and noise show in the spread. The forecaster's first pass
    starts with its phase: a phase of a whole number of intervals weighs its passes as the
    controller's cadence does. The ratio is B / A per round.

    :param every_s: the forecaster's interval (the controller's default: 30 s)
    :param rounds: A/B pairs
    """
    import multiprocessing as mp
    import statistics
    from functools import partial

    from airflow_gpupool.bench.ledger_bench import run_ledger_bench

    urls = _phase_urls(url, rounds)
    passes = mp.get_context("spawn").Queue()
    without: list[float] = []
    beside: list[float] = []
    violations, forecaster_passes, forecaster_wall = 0, 0, 0.0
    backend = ""
    for k in range(rounds):
        a = run_ledger_bench(urls[2 * k], clients=clients, seconds=seconds, nodes=nodes)
        b = run_ledger_bench(
            urls[2 * k + 1],
            clients=clients,
            seconds=seconds,
            nodes=nodes,
            beside=partial(_forecaster, every_s, passes),
        )
        count, spent = passes.get(timeout=60)
        forecaster_passes, forecaster_wall = forecaster_passes + count, forecaster_wall + spent
        backend = a["backend"]
        without.append(a["cycles_per_s"])
        beside.append(b["cycles_per_s"])
        violations += a["violations"] + b["violations"]
    ratios = [b / a for a, b in zip(without, beside, strict=True) if a > 0]
    return {
        "ledger_backend": backend,
        "ledger_cycles_per_s": round(statistics.median(without), 1),
        "ledger_cycles_per_s_with_forecaster": round(statistics.median(beside), 1),
        "ledger_phases_without": without,
        "ledger_phases_with": beside,
        "ledger_ratio_median": round(statistics.median(ratios), 3) if ratios else None,
        "ledger_ratio_min": round(min(ratios), 3) if ratios else None,
        "ledger_ratio_max": round(max(ratios), 3) if ratios else None,
        "ledger_noise_without": round(min(without) / max(without), 3)
        if max(without, default=0) > 0
        else None,
        "ledger_violations": violations,
        "ledger_clients": clients,
        "ledger_phase_s": seconds,
        "ledger_rounds": rounds,
        "forecaster_every_s": every_s,
        "forecaster_passes": forecaster_passes,
        "forecaster_step_wall_s": round(forecaster_wall, 2),
    }


def shared_rule_floor(nodes: int, waiting: int, samples: int = SAMPLES, seed: int = 42) -> dict[str, Any]:
    """Return a floor under one pass's CPU while the replays run the shared queue rule pass by pass.

    The replay serves the queue with :func:`airflow_gpupool.placement.queue.serve` after every
    event that may grant, as the ledger does, and each pass visits every request still waiting.
    The floor is ``samples`` × the entries one replay's passes visit (counted by wrapping the
    rule's ``queue_order``) × the least a visit costs: ``serve`` over the same entries with a
    ``try_place`` that answers "no fit" at once, no placement and no hold (``floor_cpu_s``). A
    second floor: every request that starts is one successful placement by the ledger's policy,
    so ``samples`` × ``waiting`` × a placement's CPU on the same nodes (``floor_places_cpu_s``).
    Both are costs no replay of the shared rule avoids; holds, failed placements and the draws
    come on top.
    """
    import airflow_gpupool.placement.queue as rule
    from airflow_gpupool.forecast.replay import _replay
    from airflow_gpupool.placement.queue import QueueEntry, serve

    state = forecast_state(nodes, waiting, seed)
    visits = passes = 0
    order = rule.queue_order

    def counted(entries: Any) -> list[QueueEntry]:
        nonlocal visits, passes
        out = order(entries)
        visits, passes = visits + len(out), passes + 1
        return out

    rule.queue_order = counted
    try:
        _replay(
            0.0,
            state["nodes"],
            state["empty"],
            state["running"],
            state["waiting"],
            state["place"],
            8,
            np.random.default_rng(seed),
        )
    finally:
        rule.queue_order = order
    entries = [QueueEntry(w.reservation_id, w.request, j) for j, w in enumerate(state["waiting"])]
    rounds = max(1, 200_000 // max(len(entries), 1))
    started = time.process_time()
    for _ in range(rounds):
        serve(entries, lambda entry, held: None, 10**9, lambda entry, held: None)
    per_visit = (time.process_time() - started) / (rounds * max(len(entries), 1))
    # Each start is one successful placement: time them on the cluster emptied (its table synced once).
    snapshot = ClusterSnapshot(tuple(state["empty"]))
    if state["waiting"]:
        state["place"](snapshot, state["waiting"][0].request)  # the first call syncs the table
    started = time.process_time()
    for w in state["waiting"]:
        state["place"](snapshot, w.request)
    per_place = (time.process_time() - started) / max(len(state["waiting"]), 1)
    return {
        "place_cpu_ms": round(per_place * 1e3, 4),
        "floor_places_cpu_s": round(samples * len(state["waiting"]) * per_place, 2),
        "replay_passes": passes,
        "replay_visits": visits,
        "visit_cpu_us": round(per_visit * 1e6, 3),
        "floor_cpu_s": round(samples * visits * per_visit, 2),
    }
