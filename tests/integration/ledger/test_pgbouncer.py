"""The ledger through PgBouncer in transaction pooling mode (``[gpupool] transaction_pooling``).

The test starts Debian's ``pgbouncer`` on a free port in front of the shared PostgreSQL
server, with a database of its own, and runs the core ledger cases and a short
``gpupool bench ledger`` through it. A transaction pooler hands every transaction any
server session: prepared statements and session settings would be lost, so the setting
turns them off (the timeouts are set per transaction instead).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from airflow_gpupool.bench.ledger_bench import run_ledger_bench
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.postgres.notify import libpq_url
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import POSTGRES_URL, node, require_postgres
from tests.skips import skip_or_fail

PGBOUNCER = "/usr/sbin/pgbouncer"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def bouncer_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh database reached through a transaction-pooling PgBouncer; the setting turned on."""
    require_postgres()
    if not os.access(PGBOUNCER, os.X_OK):
        skip_or_fail(f"{PGBOUNCER} is not installed (Debian package pgbouncer)", what="the PgBouncer test")
    server = make_url(POSTGRES_URL)
    database = f"gpupool_bouncer_{uuid.uuid4().hex[:10]}"
    admin = libpq_url(POSTGRES_URL)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    root = Path(tempfile.mkdtemp(prefix="gpupool-pgbouncer-"))
    root.chmod(0o777)  # pgbouncer runs as postgres when started by root
    port = _free_port()
    user = server.username or "postgres"
    (root / "users.txt").write_text(f'"{user}" ""\n')
    (root / "pgbouncer.ini").write_text(
        f"""[databases]
{database} = host={server.host or "127.0.0.1"} port={server.port or 5432} dbname={database}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {root / "users.txt"}
pool_mode = transaction
default_pool_size = 8
max_client_conn = 500
ignore_startup_parameters = extra_float_digits,options
logfile = {root / "pgbouncer.log"}
"""
    )
    command = [PGBOUNCER, str(root / "pgbouncer.ini")]
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        for f in root.iterdir():
            shutil.chown(f, "postgres")
        command[1:1] = ["-u", "postgres"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log = (root / "pgbouncer.log").read_text() if (root / "pgbouncer.log").exists() else ""
                    out = (
                        process.stdout.read().decode()
                        if process.stdout and process.poll() is not None
                        else ""
                    )
                    pytest.fail(f"pgbouncer did not start: {out}{log}")
                time.sleep(0.1)
        monkeypatch.setenv("AIRFLOW__GPUPOOL__TRANSACTION_POOLING", "true")
        yield f"postgresql://{user}@127.0.0.1:{port}/{database}"
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(root, ignore_errors=True)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def test_the_core_ledger_cases_through_pgbouncer(bouncer_url: str) -> None:
    ledger = Ledger.create(bouncer_url, policy="bestfit")
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=1)])
    # Many transactions on few server sessions: psycopg would prepare a statement run 5 times.
    for _ in range(12):
        held = ledger.reserve(GpuRequest(gpus=1), "cycle")
        assert held.state is ReservationState.GRANTED
        assert ledger.release(held.id).released
    grants = [ledger.reserve(GpuRequest(gpus=1), f"g{i}") for i in range(3)]
    assert all(g.state is ReservationState.GRANTED for g in grants)
    waiting = ledger.reserve(GpuRequest(gpus=1), "waiter")
    assert waiting.state is ReservationState.WAITING and waiting.position == 1
    assert "no node fits" in ledger.explain(waiting.id)
    ledger.renew(grants[0].id, ttl=120)
    ledger.bind(grants[1].id, namespace="default", name="pod-1", uid="uid-1")
    ledger.release(grants[2].id)
    assert ledger.get(waiting.id).state is ReservationState.GRANTED, "the release served the queue"
    assert ledger.check_invariants() == []
    assert len(ledger.snapshot().grants) == 3
    ledger.close()


def test_clients_in_threads_share_the_pooled_sessions(bouncer_url: str) -> None:
    ledger = Ledger.create(bouncer_url, policy="bestfit")
    ledger.upsert_nodes([node(f"n{i}", gpus=4) for i in range(4)])
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            own = Ledger(bouncer_url, policy="bestfit")
            for _ in range(15):
                reservation = own.reserve(GpuRequest(gpu_milli=500), f"t{i}", timeout=30)
                own.release(reservation.id)
            own.close()
        except BaseException as e:  # reported below, with the thread's error
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert ledger.check_invariants() == [] and ledger.snapshot().grants == ()
    ledger.close()


def test_a_short_ledger_bench_through_pgbouncer(bouncer_url: str) -> None:
    result = run_ledger_bench(bouncer_url, clients=2, seconds=2, nodes=20)
    assert result["violations"] == 0 and result["cycles"] > 0 and result["grants_left"] == 0
