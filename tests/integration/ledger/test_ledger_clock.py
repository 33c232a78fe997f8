"""One clock: on PostgreSQL every client measures leases and deadlines on the database's clock.

The skewed client is a process of its own whose ``time.time`` runs 15 minutes fast, as a
worker on a drifting machine would; it opens its ledger without an injected clock (an
injected clock wins by design, so tests with a fake one keep working). On SQLite, one
machine, the ledger keeps the local clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import FakeClock, node

SKEW = 900.0  # the fast client's clock is 15 minutes ahead
ROOT = Path(__file__).resolve().parents[3]

# The fast client: every use of time.time in its process runs SKEW seconds ahead.
_FAST_CLIENT = """
import json, sys, time
real = time.time
time.time = lambda: real() + float(sys.argv[2])
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.resources import GpuRequest
with Ledger(sys.argv[1]) as fast:
    mine = fast.reserve(GpuRequest(gpus=1), "fast client", ttl=60, timeout=60)
    fast.reap()
    renewed = fast.renew(mine.id)
    released = fast.release(mine.id).released
    print(json.dumps({
        "state": mine.state.value, "granted_at": mine.grant.granted_at, "created_at": mine.created_at,
        "deadline": mine.deadline, "renewed_until": renewed.grant.expires_at, "released": released,
        "now": fast.now(), "local": time.time(),
    }))
"""


def _run_fast_client(url: str) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", _FAST_CLIENT, url, str(SKEW)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _assert_on_the_database_clock(seen: dict[str, Any], honest_now: float) -> None:
    assert seen["local"] - seen["now"] > SKEW - 60  # its own clock is fast; the ledger's is not
    for key in ("now", "granted_at", "created_at"):
        assert abs(seen[key] - honest_now) < 60, (key, seen)
    assert abs(seen["deadline"] - (seen["created_at"] + 60)) < 1e-6
    assert abs(seen["renewed_until"] - (seen["now"] + 60)) < 60


def test_a_client_whose_clock_is_fast_expires_no_lease_and_moves_no_deadline(pg_schema_url: str) -> None:
    honest = Ledger.create(pg_schema_url)
    honest.upsert_nodes([node("n1", gpus=4)])
    held = honest.reserve(GpuRequest(gpus=2), "honest", ttl=600)
    assert held.grant is not None
    lease_until = held.grant.expires_at

    def lease_intact() -> None:
        still = honest.get(held.id)
        assert still.state is ReservationState.GRANTED  # not expired by the fast client's writes
        assert still.grant is not None and still.grant.expires_at == lease_until

    # No queue: the fast client's grant and release take the concurrent path.
    seen = _run_fast_client(pg_schema_url)
    lease_intact()
    assert seen["state"] == "granted" and seen["released"]
    _assert_on_the_database_clock(seen, honest.now())

    # A request waits for 10 minutes: now the fast client's writes take the serialized path.
    waiting = honest.reserve(GpuRequest(gpus=3), "honest waiter", timeout=600)
    assert waiting.state is ReservationState.WAITING
    seen = _run_fast_client(pg_schema_url)
    lease_intact()
    queued = honest.get(waiting.id)
    assert queued.state is ReservationState.WAITING and queued.deadline == waiting.deadline
    _assert_on_the_database_clock(seen, honest.now())
    assert abs(honest.snapshot().taken_at - seen["now"]) < 60
    assert honest.check_invariants() == []
    honest.close()


def test_sqlite_keeps_the_local_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger.create(f"sqlite:///{tmp_path}/ledger.db")
    ledger.upsert_nodes([node("n1", gpus=1)])
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + SKEW)
    assert ledger.now() - real() > SKEW - 60
    granted = ledger.reserve(GpuRequest(gpus=1), "here", ttl=30)
    assert granted.grant is not None and granted.grant.granted_at - real() > SKEW - 60
    ledger.close()


@pytest.mark.parametrize("concurrent", [True, False])
def test_an_injected_clock_wins_over_the_database_clock(pg_schema_url: str, concurrent: bool) -> None:
    clock = FakeClock()
    ledger = Ledger.create(pg_schema_url, clock=clock, concurrent=concurrent)
    ledger.upsert_nodes([node("n1", gpus=2)])
    granted = ledger.reserve(GpuRequest(gpus=1), "faked", ttl=30, timeout=40)
    assert ledger.now() == clock.now
    assert granted.grant is not None and granted.grant.granted_at == clock.now
    assert granted.grant.expires_at == clock.now + 30 and granted.deadline == clock.now + 40
    stored = ledger.get(granted.id)
    assert stored.grant is not None and stored.grant.granted_at == clock.now
    clock.advance(31)
    ledger.reap()
    assert ledger.get(granted.id).state is ReservationState.EXPIRED
    ledger.close()
