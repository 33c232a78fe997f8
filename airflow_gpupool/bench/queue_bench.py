"""`gpupool bench queue`: client cycles on a nearly full pool while thousands of tasks wait.

The question it answers: do waiting tasks cost the clients anything? On a fresh ledger (a
schema of its own on PostgreSQL, a new file on SQLite, as ``gpupool bench ledger``) of
``nodes`` nodes with 8 GPUs each, every GPU but one per node is held by a long-lived
filler, and ``waiters`` requests for a whole node wait in the queue. Then, for
``seconds``:

* one process runs a :class:`~airflow_gpupool.triggers.reservation.ReservationTrigger` per
  waiting request, in one asyncio loop, the way Airflow's triggerer runs them (each trigger
  reads only its own reservation; the process shares one ledger and one wait room);
* ``clients`` processes do reserve → hold → release cycles of one GPU on the free ones;
* a few times a second a whole node changes hands: the bench frees one (a filler node, or the
  node of a whole-node task granted before) and a whole-node task takes it. With waiters, the
  first waiter is granted it: the time from that grant to its trigger's event is a wake-up, and
  the waiter process queues a new request in its place, so ``waiters`` keep waiting. Without
  waiters, the bench reserves the whole node itself, as a task arriving then would: both runs
  turn over the same capacity at the same rate, so the ratio of their client cycles is what the
  waiting requests cost, not what a node changing hands costs. (Until 2026-12-03 the run
  without waiters freed no node at all.)

After the clients stop, the bench waits a second for the last wake-ups; with ``min_wakeups``
it goes on freeing nodes (clients stopped) until the waiters have been woken that many times,
or for at most :data:`MIN_WAKEUPS_CEILING_S`, so a short run on a loaded machine still sees
wake-ups, and a run that sees none has found wake-ups broken, not the window too short.

It reports the clients' ``cycles_per_s``, ``wakeup_p50_ms``/``wakeup_p99_ms`` (from the
grant's time on the ledger's clock, taken as its transaction took the lock, to the event),
``connections_max`` (PostgreSQL: the most sessions of the bench's processes at once, from
``pg_stat_activity``), ``waiter_cpu_percent`` (the waiter process's CPU, in % of one core),
``nodes_turned_over`` and the invariants, checked during and after the run.

With ``baseline`` the run without waiters is made in the same run, on a second ledger (its own
schema, or a file beside the first), and the clients cycle on the two in turns of ``phase_s``
(:mod:`~airflow_gpupool.bench.phases`: one warm-up phase each, then A B B A over and over,
``seconds`` each in all). Both runs then see the machine's load alike: two runs one after the
other on a shared machine differ by a factor 1.3 or more, two interleaved ones without waiters
by a few points. The waiter process runs throughout, as a triggerer would: its idle CPU and its
answers to grants made just before a baseline phase fall on the baseline, so the ratio errs, if
at all, on the kind side (stopping it outside its run's phases erred further: see
:mod:`~airflow_gpupool.bench.phases`). It adds ``baseline_cycles_per_s``,
``baseline_nodes_turned_over`` and ``ratio``; the wake-ups are measured as in a run alone.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from airflow_gpupool import settings
from airflow_gpupool.bench.ledger_bench import fresh_bench_url, gather, percentile, pg_bench_schema
from airflow_gpupool.bench.phases import Side, run_phases
from airflow_gpupool.bench.queue_pool import WAIT_S, WAITER_SHAPE, free_a_node, open_sides, queue_waiters
from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.resources import GpuRequest

__all__ = ["run_queue_bench"]

#: What the clients cycle: one GPU, or half of one.
CLIENT_SHAPES = (GpuRequest(gpus=1, cpu_milli=4000, memory_mib=16384), GpuRequest(gpu_milli=500))
#: How long past the measured window the bench waits for ``min_wakeups`` wake-ups at most.
MIN_WAKEUPS_CEILING_S = 120.0


def _waiters(url: str, ids: list[str], ready: Any, stop: Any, out: Any, woken: Any) -> None:
    """The triggerer: one trigger per waiting request, in one event loop; ``woken`` counts the
    wake-ups as they come (a shared integer the bench reads)."""
    from airflow_gpupool.triggers import ReservationTrigger

    _log_warnings_to_stderr()
    wakeups: list[float] = []

    async def watch(rid: str) -> None:
        trigger = ReservationTrigger(rid, None, ledger_url=url)
        async for fired in trigger.run():
            now = time.time()
            payload = fired.payload
            if payload["status"] == "granted":
                wakeups.append((now - float(payload["grant"]["granted_at"])) * 1000)
                with woken.get_lock():
                    woken.value += 1
            return

    async def main() -> None:
        from airflow_gpupool.hooks.gpupool import AsyncGpuPoolHook
        from airflow_gpupool.triggers.wait_room import wait_room

        # The ledger the triggers share: resolved as their hooks resolve it (bindings included).
        hook = AsyncGpuPoolHook(None, ledger_url=url)
        await hook.aoptions()
        ledger = hook.ledger
        room = wait_room(ledger, settings.poll_interval_seconds())
        tasks = {asyncio.create_task(watch(rid)) for rid in ids}
        started = time.monotonic()
        # The clock starts once every trigger has read its request and waits in the room.
        while len(room) < len(ids) and time.monotonic() - started < WAIT_S:
            ended = [t for t in tasks if t.done()]
            if ended:  # a trigger that failed or fired before the clock would leave the room short forever
                ended[0].result()
                raise RuntimeError(f"{len(ended)} of {len(ids)} triggers fired before the clock started")
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        ready.put(len(tasks))
        cpu[:] = [time.process_time(), time.monotonic()]
        made = 0
        while not stop.is_set():
            done = {t for t in tasks if t.done()}
            tasks -= done
            for _ in done:  # keep the queue as long: a new request for each one granted
                made += 1
                rid = f"waiter-new-{made:06d}"
                await asyncio.to_thread(
                    ledger.reserve,
                    WAITER_SHAPE,
                    "bench-waiter",
                    ttl=WAIT_S,
                    timeout=WAIT_S,
                    reservation_id=rid,
                )
                tasks.add(asyncio.create_task(watch(rid)))
            await asyncio.sleep(0.05)
        cpu[:] = [time.process_time() - cpu[0], time.monotonic() - cpu[1]]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    cpu: list[float] = []
    asyncio.run(main())
    out.put({"wakeups_ms": wakeups, "cpu_s": cpu[0], "wall_s": cpu[1]})


def _log_warnings_to_stderr() -> None:
    """Log as the ``gpupool`` command does: Airflow, imported in a spawned process, logs to stdout,
    which the bench's ``--json`` answer owns (and 1,000 triggers' INFO lines cost CPU)."""
    import airflow.settings  # noqa: F401  (configures logging on import: configure after it)
    import structlog

    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    # Triggers log through Airflow's structlog, which prints to stdout itself.
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )


def _client(urls: list[str], index: int, hold_s: float, phase: Any, ready: Any, go: Any, out: Any) -> None:
    """Cycle on ``urls[phase.value]`` until the phase turns negative; count the cycles per phase."""
    _log_warnings_to_stderr()
    rng = random.Random(index)
    ledgers = [Ledger(url) for url in urls]
    for ledger in ledgers:
        ledger.reap()  # connected, schema checked, capacity cached before the clock starts
    ready.put(index)
    go.wait()
    # Phases 0..n-1 are measured, n..2n-1 warm-ups on ledger phase - n: counted apart.
    cycles, queued = [0] * (2 * len(urls)), 0
    started = time.perf_counter()
    while (side := phase.value) >= 0:
        ledger = ledgers[side % len(urls)]
        reservation = ledger.reserve(rng.choice(CLIENT_SHAPES), f"bench-client-{index}", ttl=60, timeout=30)
        queued += reservation.state is not ReservationState.GRANTED
        time.sleep(hold_s)
        ledger.release(reservation.id)
        cycles[side] += 1
    elapsed = time.perf_counter() - started
    for ledger in ledgers:
        ledger.close()
    out.put({"cycles": cycles, "queued": queued, "elapsed": elapsed})


_SESSIONS = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE :pattern"
)


class _Sessions:
    """The most PostgreSQL sessions of the bench's processes at once (sampled)."""

    def __init__(self, url: str, backend: str) -> None:
        self.most = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if backend == "postgresql":
            self._engine = create_engine(normalize_url(url), poolclass=None)
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        # A failing sampler must not pass for "no connections": most stays None then.
        self.most = None  # type: ignore[assignment]
        with self._engine.connect() as conn:
            self.most = 0
            while not self._stop.is_set():
                count = conn.execute(_SESSIONS, {"pattern": "gpupool%"}).scalar_one()
                conn.rollback()
                self.most = max(self.most, int(count))
                self._stop.wait(0.1)

    def stop(self) -> int | None:
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        self._engine.dispose()
        return self.most


def _await_wakeups(
    ledger: Ledger,
    fillers: dict[str, list[str]],
    granted_nodes: list[str],
    woken: Any,
    *,
    min_wakeups: int,
    frees_per_s: float,
) -> float:
    """Wait a second for the last wake-ups, longer while fewer than ``min_wakeups`` came (freeing
    nodes as during the run, at most :data:`MIN_WAKEUPS_CEILING_S`); return the seconds waited."""
    started = time.monotonic()
    while True:
        waited = time.monotonic() - started
        if waited >= 1.0 and (woken.value >= min_wakeups or waited >= MIN_WAKEUPS_CEILING_S):
            return waited
        if woken.value < min_wakeups:
            free_a_node(ledger, fillers, granted_nodes)
        time.sleep(1.0 / frees_per_s)


def run_queue_bench(
    url: str,
    *,
    waiters: int,
    clients: int,
    seconds: float,
    nodes: int = 32,
    hold_ms: float = 2.0,
    frees_per_s: float = 4.0,
    min_wakeups: int = 0,
    baseline: bool = False,
    phase_s: float = 1.0,
) -> dict[str, Any]:
    """Run the benchmark and return its numbers (see the module docstring).

    :param min_wakeups: after the clients stop, wait (freeing nodes) until this many waiters were
        woken, at most :data:`MIN_WAKEUPS_CEILING_S`; needs ``waiters``
    :param baseline: interleave a run without waiters on a second ledger, ``phase_s`` seconds
        at a time (``seconds`` each in all), and report its cycles and the ratio
    """
    if min_wakeups and not waiters:
        raise ConfigurationError("bench queue: --min-wakeups needs --waiters > 0 (someone to wake)")
    bench_schema = f"gpupool_qbench_{os.getpid()}"
    urls = [fresh_bench_url(url, bench_schema)]
    if baseline:
        urls.append(_baseline_url(url, urls[0], bench_schema))
    backend = make_url(urls[0]).get_backend_name()
    schemas = [bench_schema, f"{bench_schema}_baseline"][: len(urls)]
    if backend == "postgresql":
        for name in schemas:
            pg_bench_schema(url, name, create=True)
    try:
        sides = open_sides(urls, nodes, waiters)
        ids = queue_waiters(sides[0].ledger, waiters)
        ctx = mp.get_context("spawn")
        ready, out, go, stop = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
        phase = ctx.Value("i", 0)
        woken_count = ctx.Value("i", 0)
        waiting = ctx.Process(target=_waiters, args=(urls[0], ids, ready, stop, out, woken_count))
        waiting.start()
        gather(ready, [waiting], timeout=600)
        procs = [
            ctx.Process(target=_client, args=(urls, i, hold_ms / 1000, phase, ready, go, out))
            for i in range(clients)
        ]
        for p in procs:
            p.start()
        gather(ready, procs)
        sessions = _Sessions(urls[0], backend)
        go.set()
        violations = run_phases(sides, phase, seconds=seconds, phase_s=phase_s, frees_per_s=frees_per_s)
        results = gather(out, procs)
        first = sides[0]
        wakeup_wait = _await_wakeups(
            first.ledger,
            first.fillers,
            first.granted_nodes,
            woken_count,
            min_wakeups=min_wakeups,
            frees_per_s=frees_per_s,
        )
        stop.set()
        woken = gather(out, [waiting])[0]
        for p in [*procs, waiting]:
            p.join()
        connections = sessions.stop()
        for side in sides:
            violations += side.ledger.check_invariants()
            side.ledger.close()
    finally:
        if backend == "postgresql":
            for name in schemas:
                pg_bench_schema(url, name, create=False)
    return _answer(
        sides,
        results,
        woken,
        backend=backend,
        waiters=waiters,
        clients=clients,
        nodes=nodes,
        seconds=seconds,
        waiter_wall_s=woken["wall_s"],
        wakeup_wait_s=wakeup_wait,
        connections=connections,
        violations=violations,
        phase_s=phase_s if baseline else None,
    )


def _answer(
    sides: list[Side],
    results: list[dict[str, Any]],
    woken: dict[str, Any],
    *,
    backend: str,
    waiters: int,
    clients: int,
    nodes: int,
    seconds: float,
    waiter_wall_s: float,
    wakeup_wait_s: float,
    connections: int | None,
    violations: list[str],
    phase_s: float | None,
) -> dict[str, Any]:
    cycles = [sum(r["cycles"][k] for r in results) for k in range(len(sides))]
    # One run alone: the clients' own clocks, as before phases; interleaved: the phases' time.
    wall = sides[0].spent if phase_s else max([r["elapsed"] for r in results] or [seconds])
    wakeups = woken["wakeups_ms"]
    answer = {
        "backend": backend,
        "waiters": waiters,
        "clients": clients,
        "nodes": nodes,
        "seconds": round(wall, 2),
        "cycles": cycles[0],
        "cycles_per_s": round(cycles[0] / wall, 1),
        "queued": sum(r["queued"] for r in results),
        # Whole nodes freed and taken again while the clients ran (the same rate with or without waiters).
        "nodes_turned_over": sides[0].turned_over,
        "wakeups": len(wakeups),
        # Seconds waited after the clients stopped: 1, or more while fewer than min_wakeups came.
        "wakeup_wait_s": round(wakeup_wait_s, 2),
        "wakeup_p50_ms": round(statistics.median(wakeups), 1) if wakeups else None,
        "wakeup_p99_ms": round(percentile(wakeups, 0.99), 1) if wakeups else None,
        "connections_max": connections,
        # The waiter process's CPU while it ran, in % of one core (re-queueing granted waiters included).
        "waiter_cpu_percent": round(100 * woken["cpu_s"] / waiter_wall_s, 1) if waiter_wall_s > 0 else None,
        "violations": len(violations),
        "violation_examples": violations[:5],
        "cpu_count": os.cpu_count(),
    }
    if phase_s:
        rest = sides[1]
        answer["baseline_cycles_per_s"] = round(cycles[1] / rest.spent, 1)
        answer["baseline_nodes_turned_over"] = rest.turned_over
        answer["ratio"] = round(cycles[0] / wall / (cycles[1] / rest.spent), 3) if cycles[1] else None
        answer["phase_s"] = phase_s
    return answer


def _baseline_url(url: str, bench_url: str, bench_schema: str) -> str:
    """The second ledger of an interleaved run: a schema of its own, or a file beside the first."""
    parsed = make_url(bench_url)
    if parsed.get_backend_name() == "postgresql":
        return fresh_bench_url(url, f"{bench_schema}_baseline")
    path = Path(parsed.database or "")
    return fresh_bench_url(
        str(parsed.set(database=str(path.with_name(f"{path.stem}-baseline{path.suffix}")))), ""
    )
