"""The ledger rides out a PostgreSQL outage: clients keep working, no raw error, nothing lost.

Runs on a throw-away cluster (:mod:`tests.integration.ledger.pg_cluster`) that the test
stops and starts again, never on the shared server.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from airflow_gpupool.exceptions import LedgerUnavailableError
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.resources import GpuRequest
from tests.integration.ledger.pg_cluster import ThrowawayCluster, throwaway_pg
from tests.ledger_fixtures import node

__all__ = ["throwaway_pg"]

CLIENTS = 3
CYCLES = 5  # reserve/release cycles each client completes before the outage and after it


@pytest.fixture
def outage_url(throwaway_pg: ThrowawayCluster) -> Iterator[str]:
    """A migrated ledger with 4 nodes of 2 GPUs, in a fresh schema of the throw-away cluster."""
    name = f"gpupool_o_{uuid.uuid4().hex[:10]}"
    admin = create_engine(normalize_url(throwaway_pg.url))
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {name}")
    admin.dispose()
    url = make_url(throwaway_pg.url).update_query_dict({"options": f"-csearch_path={name}"})
    rendered = url.render_as_string(hide_password=False)
    with Ledger.create(rendered, policy="bestfit") as ledger:
        ledger.upsert_nodes([node(f"n{i}", gpus=2) for i in range(4)])
    yield rendered


@dataclass
class Client:
    """A client reserving and releasing one GPU in a loop; every error it sees is kept."""

    url: str
    index: int
    cycles: int = 0
    granted: list[str] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    progress: threading.Condition = field(default_factory=threading.Condition)

    def run(self, stop: threading.Event) -> None:
        with Ledger(self.url, policy="bestfit") as ledger:
            while not stop.is_set():
                try:
                    grant = ledger.reserve(GpuRequest(gpus=1), f"client-{self.index}", ttl=600)
                    assert grant.state is ReservationState.GRANTED, grant
                    self.granted.append(grant.id)
                    ledger.release(grant.id)
                except Exception as error:  # every error is a failure of the test; keep them all
                    self.errors.append(error)
                    return
                with self.progress:
                    self.cycles += 1
                    self.progress.notify_all()

    def wait_for(self, cycles: int, timeout: float) -> None:
        with self.progress:
            done = self.progress.wait_for(lambda: self.cycles >= cycles or bool(self.errors), timeout)
        assert not self.errors, self.errors
        assert done, f"client {self.index} made {self.cycles} cycles, not {cycles}, in {timeout} s"


@pytest.mark.postgres
@pytest.mark.parametrize(
    "outage_s", [pytest.param(4.0, id="4s"), pytest.param(30.0, id="30s", marks=pytest.mark.slow)]
)
def test_clients_ride_out_a_server_outage_without_errors_or_lost_grants(
    outage_url: str, throwaway_pg: ThrowawayCluster, monkeypatch: pytest.MonkeyPatch, outage_s: float
) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__LEDGER_RETRY_SECONDS", str(outage_s + 20))
    clients = [Client(outage_url, i) for i in range(CLIENTS)]
    stop = threading.Event()
    threads = [threading.Thread(target=c.run, args=(stop,), daemon=True) for c in clients]
    for thread in threads:
        thread.start()
    try:
        for client in clients:
            client.wait_for(CYCLES, timeout=60)
        throwaway_pg.stop("fast")  # an admin shutdown: every session is ended mid-work
        time.sleep(outage_s)  # the outage itself
        throwaway_pg.start()
        resumed = [c.cycles for c in clients]
        for client, before in zip(clients, resumed, strict=True):
            client.wait_for(before + CYCLES, timeout=outage_s + 60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=outage_s + 60)
    assert [c.errors for c in clients] == [[]] * CLIENTS
    granted = [rid for c in clients for rid in c.granted]
    assert len(granted) == len(set(granted)) >= 2 * CYCLES * CLIENTS
    with Ledger(outage_url, policy="bestfit") as ledger:
        assert ledger.check_invariants() == []
        assert ledger.snapshot().grants == ()  # nothing orphaned: every grant was released
        history = {r.id: r for r in ledger.history(limit=10 * len(granted))}
        assert all(history[rid].state is ReservationState.RELEASED for rid in granted)
        assert len(history) == len(granted)  # one reservation per grant a client saw, no strays


@pytest.mark.postgres
def test_an_outage_longer_than_the_retry_budget_gives_ledger_unavailable(
    outage_url: str, throwaway_pg: ThrowawayCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__LEDGER_RETRY_SECONDS", "2")
    with Ledger(outage_url, policy="bestfit") as ledger:
        held = ledger.reserve(GpuRequest(gpus=1), "before", ttl=600)
        throwaway_pg.stop("fast")
        try:
            started = time.monotonic()
            with pytest.raises(LedgerUnavailableError) as caught:
                ledger.reserve(GpuRequest(gpus=1), "during", ttl=600)
            assert 2.0 <= time.monotonic() - started < 2.0 + 5.0
            with pytest.raises(LedgerUnavailableError):
                ledger.release(held.id)
        finally:
            throwaway_pg.start()
        assert caught.value.seconds == 2.0
        assert "ledger_retry_seconds" in str(caught.value)
        # The same ledger object works again once the server is back.
        assert ledger.release(held.id).released
        assert ledger.check_invariants() == []
