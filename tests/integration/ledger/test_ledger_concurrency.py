"""Many processes racing on one ledger, and a holder that dies: real clocks, real databases."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db import schema as ledger_schema
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node

# Explicit policy and overtake bound: child processes then never read Airflow's configuration.
OPTIONS: dict[str, Any] = {"policy": "bestfit", "max_overtakes": 4}

#: Small on purpose, so that clients contend and queue: 6 whole GPUs and one MIG-partitioned GPU.
INVENTORY = [
    node("c1", gpus=2, cpu=32000, mem=131072),
    node("c2", gpus=2, cpu=32000, mem=131072),
    node("c3", gpus=2, cpu=32000, mem=131072, labels={"zone": "b"}),
    node("c4", gpus=1, cpu=32000, mem=131072, mig={0: ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}),
]

SHAPES = (
    GpuRequest(gpus=1, cpu_milli=4000),
    GpuRequest(gpus=2, cpu_milli=8000, workload_class="training"),
    GpuRequest(gpus=1, node_labels={"zone": "b"}, priority=3),
    GpuRequest(gpu_milli=250, workload_class="inference"),
    GpuRequest(gpu_milli=500, gpu_memory_mib=20480, workload_class="inference"),
    GpuRequest(mig_profile="1g.10gb"),
    GpuRequest(mig_profile="3g.40gb", workload_class="training", priority=1),
)


def race_client(url: str, index: int, ready: Any, go: Any, seconds: float, out: Any) -> None:
    """Reserve, hold or wait a little, then release, until ``seconds`` pass; report what happened."""
    rng = random.Random(index)
    stats: dict[str, Any] = {"reserved": 0, "queued": 0, "released": Counter(), "errors": []}
    ledger = Ledger(url, **OPTIONS)
    try:
        ledger.get_or_none("warm-up")  # connect and check the schema before the race starts
        ready.put(index)
        go.wait(120)
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                reservation = ledger.reserve(rng.choice(SHAPES), f"client-{index}", ttl=60, timeout=60)
                stats["reserved"] += 1
                if reservation.state is ReservationState.WAITING:
                    stats["queued"] += 1
                    patience = time.time() + rng.uniform(0.0, 0.3)
                    while (
                        time.time() < patience
                        and ledger.get(reservation.id).state is ReservationState.WAITING
                    ):
                        time.sleep(0.02)
                else:
                    time.sleep(rng.uniform(0.0, 0.02))
                # Withdraws the request if it still waits, gives the grant back otherwise.
                result = ledger.release(reservation.id)
                if not result.released:
                    stats["errors"].append(f"release of {reservation.id} did nothing: {result.message}")
                stats["released"][result.state.value] += 1
            except Exception as e:  # every error must reach the parent, which fails the test
                stats["errors"].append(repr(e))
    finally:
        ledger.close()
        out.put(stats)


def hold_everything_until_killed(url: str, out: Any) -> None:
    """Take every GPU with a short lease, tell the parent, then keep the lease alive until killed.

    Renewing like a live worker does means the lease cannot run out before the kill, however
    slowly a loaded machine runs the parent: only the kill lets it expire.
    """
    ledger = Ledger(url, **OPTIONS)
    reservation = ledger.reserve(GpuRequest(gpus=2), "doomed-child", ttl=1.5, timeout=60)
    out.put((reservation.id, reservation.state.value))
    stop = threading.Event()
    while not stop.wait(0.2):
        ledger.renew(reservation.id)


def states_in_database(url: str) -> Counter[str]:
    """Count reservations by state, straight from the table."""
    engine = create_engine(normalize_url(url))
    r = ledger_schema.reservations.c
    with engine.connect() as conn:
        counts = Counter(
            {state: n for state, n in conn.execute(select(r.state, func.count()).group_by(r.state))}
        )
    engine.dispose()
    return counts


def run_race(url: str, clients: int, seconds: float) -> None:
    ledger = Ledger.create(url, **OPTIONS)
    ledger.upsert_nodes(INVENTORY)
    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=race_client, args=(url, i, ready, go, seconds, out)) for i in range(clients)]
    for p in procs:
        p.start()
    try:
        assert sorted(ready.get(timeout=120) for _ in procs) == list(range(clients))
        # The parent holds two whole nodes for the first half: the clients must queue for the rest.
        blockers = [ledger.reserve(GpuRequest(gpus=2), "parent", ttl=60, timeout=60) for _ in range(2)]
        assert [b.state for b in blockers] == [ReservationState.GRANTED] * 2
        go.set()
        started = time.time()
        samples: list[list[str]] = []
        while blockers or time.time() < started + seconds or len(samples) < 3:
            samples.append(ledger.check_invariants())
            if blockers and time.time() > started + seconds / 2:
                assert all(ledger.release(b.id).released for b in blockers)
                blockers = []
            time.sleep(0.3)
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()

    assert [e for r in results for e in r["errors"]] == []
    assert len(samples) >= 3
    assert [v for s in samples for v in s] == []
    assert ledger.check_invariants() == []
    snap = ledger.snapshot()
    assert (snap.grants, snap.queue) == ((), ())
    released: Counter[str] = sum((r["released"] for r in results), Counter())
    reserved = sum(r["reserved"] for r in results)
    assert sum(released.values()) == reserved > 0
    assert sum(r["queued"] for r in results) > 0, "the inventory is small enough that some requests queue"
    # Every reservation ended by its holder: grants released (the parent's two included), waiting
    # requests withdrawn; unary + drops a zero count.
    expected = Counter({"released": released["granted"] + 2, "cancelled": released["waiting"]})
    assert states_in_database(url) == +expected
    ledger.close()


@pytest.mark.postgres
def test_eight_processes_race_on_postgresql_without_violations(pg_schema_url: str) -> None:
    run_race(pg_schema_url, clients=8, seconds=3.0)


def test_four_processes_race_on_sqlite_without_lock_errors(tmp_path: Any) -> None:
    run_race(f"sqlite:///{tmp_path}/race.db", clients=4, seconds=3.0)


def test_killed_holder_lease_expires_and_queue_is_served(ledger_url: str) -> None:
    ledger = Ledger.create(ledger_url, **OPTIONS)
    ledger.upsert_nodes([node("k1", gpus=2)])
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=hold_everything_until_killed, args=(ledger_url, out), daemon=True)
    child.start()
    try:
        doomed_id, state = out.get(timeout=120)
        assert state == "granted"
        queued = ledger.reserve(GpuRequest(gpus=1), "survivor", ttl=60, timeout=120)
        assert queued.state is ReservationState.WAITING and queued.position == 1
        assert ledger.get(doomed_id).state is ReservationState.GRANTED

        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=30)
        assert child.exitcode == -signal.SIGKILL

        give_up = time.monotonic() + 5.0
        while ledger.get(queued.id).state is ReservationState.WAITING and time.monotonic() < give_up:
            ledger.reap()
            time.sleep(0.05)
    finally:
        if child.is_alive():
            child.kill()
            child.join()

    doomed = ledger.get(doomed_id)
    assert doomed.state is ReservationState.EXPIRED
    assert doomed.message == "lease expired without renewal"
    survivor = ledger.get(queued.id)
    assert survivor.state is ReservationState.GRANTED
    assert survivor.grant is not None and survivor.grant.node == "k1" and len(survivor.grant.gpu_indices) == 1
    assert ledger.check_invariants() == []
    ledger.release(queued.id)
    ledger.close()
