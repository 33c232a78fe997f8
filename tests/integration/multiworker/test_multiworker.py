"""End to end on a real multi-worker Airflow: two Celery workers race GPU tasks; one is SIGKILLed mid-pod.

The test starts Redis (Debian's ``redis-server``), an API server, a scheduler, a DAG processor, a
triggerer and two ``airflow celery worker`` processes on a PostgreSQL metadata database, the
``gpupool controller`` on a PostgreSQL ledger, and the Kubernetes emulator (in this process: its
pod history is read directly). The three DAGs in ``dags/`` race eight one-GPU tasks for three
GPUs. Worker A starts first and takes the two long pods (``durable=True`` and ``durable=False``);
worker B starts once they run; then worker A, its task supervisors and task runners are
SIGKILLed. Every task must end ``success`` after its retries, no GPU may ever have run two pods
at once (from the emulator's pod history, not the ledger), and no grant may be left.
"""

from __future__ import annotations

import secrets
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

from airflow_gpupool.ledger import Ledger, Reservation, ReservationState
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from airflow_gpupool.testing.pods.pod_history import PodRecord, gpu_overlaps
from tests.integration.multiworker.harness import (
    BIN,
    HarnessError,
    ManagedProcess,
    ProcessGroup,
    airflow_env,
    free_port,
    start_airflow,
    start_celery_worker,
    wait_until_healthy,
    wait_until_ready,
)
from tests.ledger_fixtures import POSTGRES_URL, require_postgres
from tests.skips import skip_or_fail

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(480)]

REDIS_SERVER = "/usr/bin/redis-server"
DAG_IDS = ("mw_long", "mw_race_a", "mw_race_b")
TASKS = 8
LONG_TASKS = ("durable_pod", "ephemeral_pod")
NODES = [gpu_node("gpu-a", gpus=2, pool="mw"), gpu_node("gpu-b", gpus=1, pool="mw")]
GPUS = 3


@pytest.fixture
def metadata_db_url() -> Iterator[str]:
    """A fresh PostgreSQL database for Airflow's metadata, dropped afterwards."""
    require_postgres()
    name = f"gpupool_mw_{uuid.uuid4().hex[:10]}"
    server = make_url(POSTGRES_URL).set(drivername="postgresql+psycopg")
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()


@pytest.fixture
def metadata(metadata_db_url: str) -> Iterator[Engine]:
    engine = create_engine(metadata_db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def mw_ledger(pg_schema_url: str) -> Iterator[Ledger]:
    """An empty PostgreSQL ledger; the controller fills its inventory from the emulator."""
    ledger = Ledger.create(pg_schema_url)
    yield ledger
    ledger.close()


@pytest.fixture
def redis_server() -> str:
    if shutil.which(REDIS_SERVER) is None:
        skip_or_fail(f"{REDIS_SERVER} is missing: apt-get install redis-server", what="the multi-worker test")
    return REDIS_SERVER


def task_instances(engine: Engine) -> list[dict[str, Any]]:
    """Return the test DAGs' task instances from the metadata database."""
    query = "SELECT dag_id, task_id, state, try_number, pid FROM task_instance WHERE dag_id = ANY(:dags)"
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(query), {"dags": list(DAG_IDS)})]


def running_long_pods(k8s: KubernetesEmulatorServer) -> dict[tuple[str, str], dict[str, Any]]:
    """Return the running pods of the long tasks by ``(task id, try number)``."""
    pods = k8s.pods("default", label_selector="dag_id=mw_long")
    return {
        (p["metadata"]["labels"].get("task_id"), p["metadata"]["labels"].get("try_number")): p
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running"
    }


@dataclass
class Outcome:
    """What the run left: task instances, pod records, the ledger's history, and its timeline."""

    tis: list[dict[str, Any]]
    records: list[PodRecord]
    history: list[Reservation]
    times: dict[str, float]
    killed: list[int]
    killed_tries: dict[str, int]

    def pods_of(self, dag_id: str, task_id: str) -> list[PodRecord]:
        """Return the pods of one task (by KubernetesPodOperator's labels), oldest first."""
        return [
            r for r in self.records if (r.labels.get("dag_id"), r.labels.get("task_id")) == (dag_id, task_id)
        ]

    def reservations_of(self, dag_id: str, task_id: str) -> list[Reservation]:
        """Return the ledger's reservations of one task, oldest first."""
        mine = [r for r in self.history if r.holder.startswith(f"{dag_id}/{task_id}/")]
        return sorted(mine, key=lambda r: r.created_at)

    def summary(self, wall_start: float) -> str:
        """Return the timeline, the pods and the reservations, for the test's output."""
        lines = [", ".join(f"{k} {v:.0f}s" for k, v in self.times.items()) + f"; {len(self.killed)} killed"]
        for r in self.records:
            start, end = r.running_between(r.ended_at or 0) or (0.0, 0.0)
            lines.append(
                f"  {r.name:26} {r.node} GPU {','.join(r.gpus.devices):3} ran {start - wall_start:5.1f}"
                f" to {end - wall_start:5.1f}s {r.end or '?':9} {r.reservation_id}"
            )
        for res in sorted(self.history, key=lambda r: r.created_at):
            lines.append(
                f"  {res.id} {res.state.value:9} {res.holder.split('/scheduled')[0]:24} {res.message}"
            )
        return "\n".join(lines)


def long_pods_under(
    metadata: Engine, k8s: KubernetesEmulatorServer, worker: ManagedProcess
) -> dict[str, dict[str, Any]] | None:
    """Return the long tasks' instances if both run a pod of their current try from under ``worker``."""
    tis = {t["task_id"]: t for t in task_instances(metadata) if t["dag_id"] == "mw_long"}
    pods = running_long_pods(k8s)
    on_worker = {p.pid for p in worker.descendants()}
    for task_id in LONG_TASKS:
        ti = tis.get(task_id)
        if ti is None or ti["state"] != "running" or ti["pid"] not in on_worker:
            return None
        if (task_id, str(ti["try_number"])) not in pods:
            return None
    return tis


def run_the_race(
    procs: ProcessGroup,
    k8s: KubernetesEmulatorServer,
    ledger: Ledger,
    metadata: Engine,
    *,
    api_port: int,
    ledger_url: str,
) -> Outcome:
    """Start everything, kill worker A mid-pod, wait until every task succeeded and no grant is left."""
    started = time.monotonic()
    times: dict[str, float] = {}
    procs.start(
        "controller",
        [
            *(str(BIN / "python"), "-m", "airflow_gpupool.cli", "controller", "run"),
            *("--url", ledger_url, "--kubeconfig", k8s.kubeconfig_path),
            *("--sync-interval", "5", "--reconcile-interval", "2"),
        ],
    )
    start_airflow(procs, api_port)
    worker_a = start_celery_worker(procs, "worker-a")
    procs.wait_for(
        "the controller to sync the emulator's GPUs into the ledger",
        lambda: sum(len(n.gpus) for n in ledger.snapshot().cluster.nodes) == GPUS,
        90,
    )
    wait_until_healthy(procs, api_port, 150)
    wait_until_ready(procs, worker_a, 120)
    times["ready"] = time.monotonic() - started

    # Worker A is the only worker, so the long pods run under it (a task that defers while it
    # waits for a GPU comes back on any worker: worker B starts only once both pods run).
    procs.wait_for(
        "both long pods to run from worker A", lambda: long_pods_under(metadata, k8s, worker_a), 150
    )
    worker_b = start_celery_worker(procs, "worker-b")
    wait_until_ready(procs, worker_b, 120)
    victims = long_pods_under(metadata, k8s, worker_a)
    if victims is None:
        raise HarnessError(procs.report(f"a long pod stopped before the kill: {task_instances(metadata)}"))

    worker_a.killed = True
    killed = worker_a.kill_all(signal.SIGKILL)
    times["kill"] = time.monotonic() - started

    def all_succeeded() -> list[dict[str, Any]] | None:
        tis = task_instances(metadata)
        failed = [t for t in tis if t["state"] in {"failed", "upstream_failed", "removed"}]
        if failed:
            raise HarnessError(procs.report(f"tasks failed: {failed}"))
        return tis if len(tis) == TASKS and all(t["state"] == "success" for t in tis) else None

    tis = procs.wait_for("every task to succeed", all_succeeded, 300, interval=1)
    times["all succeeded"] = time.monotonic() - started

    def no_grant_left() -> bool:
        snapshot = ledger.snapshot()
        return not snapshot.grants and not snapshot.queue

    procs.wait_for("the ledger to hold no grant", no_grant_left, 30)
    times["no grant left"] = time.monotonic() - started
    killed_tries = {t: victims[t]["try_number"] for t in LONG_TASKS}
    return Outcome(tis, k8s.pod_records(), ledger.history(limit=1000), times, killed, killed_tries)


def test_two_celery_workers_race_for_gpus_and_survive_a_worker_kill(
    tmp_path: Path,
    metadata_db_url: str,
    metadata: Engine,
    mw_ledger: Ledger,
    pg_schema_url: str,
    redis_server: str,
) -> None:
    wall_start = time.time()
    api_port, redis_port = free_port(), free_port()
    with KubernetesEmulatorServer(NODES, kubeconfig_path=tmp_path / "kubeconfig") as k8s:
        env = airflow_env(
            home=tmp_path / "airflow",
            metadata_url=metadata_db_url,
            broker_url=f"redis://127.0.0.1:{redis_port}/0",
            api_port=api_port,
            ledger_url=pg_schema_url,
            kubeconfig=k8s.kubeconfig_path,
            jwt_secret=secrets.token_urlsafe(32),
        )
        with ProcessGroup(tmp_path / "logs", env) as procs:
            procs.start(
                "redis",
                [
                    redis_server,
                    "--port",
                    str(redis_port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ],
            )
            migrate = subprocess.run(
                [str(BIN / "airflow"), "db", "migrate"], env=env, capture_output=True, text=True, timeout=180
            )
            assert migrate.returncode == 0, (
                f"airflow db migrate failed:\n{migrate.stdout[-3000:]}{migrate.stderr[-3000:]}"
            )
            procs.wait_for_line("redis", r"Ready to accept connections", 30)
            outcome = run_the_race(
                procs, k8s, mw_ledger, metadata, api_port=api_port, ledger_url=pg_schema_url
            )
    print(f"\nmulti-worker end to end: {outcome.summary(wall_start)}")

    # Every task succeeded; the long ones in a later try than the one killed.
    assert sorted((t["dag_id"], t["task_id"]) for t in outcome.tis) == sorted(
        [("mw_long", t) for t in LONG_TASKS] + [(d, f"train_{i}") for d in DAG_IDS[1:] for i in range(3)]
    )
    for task_id in LONG_TASKS:
        [ti] = [t for t in outcome.tis if t["task_id"] == task_id]
        assert ti["try_number"] > outcome.killed_tries[task_id], f"{task_id} was not retried after the kill"

    # No GPU ever ran two pods at once, by the cluster's account; and the check had work to do.
    ran = [r for r in outcome.records if r.started_at is not None]
    assert all(r.node and r.gpus.devices for r in ran), [r.describe() for r in ran if not r.gpus.devices]
    assert len(ran) > 2 * GPUS, "too few pods for a race"
    assert gpu_overlaps(outcome.records) == []
    assert [r.describe() for r in outcome.records if r.ended_at is None] == []

    check_durable_reattach(outcome)
    check_fresh_start(outcome)


def try_of(pod: PodRecord) -> int:
    return int(pod.labels["try_number"])


def check_durable_reattach(outcome: Outcome) -> None:
    """``durable=True``: the retry re-attached to the killed try's pod and adopted its grant."""
    killed = outcome.killed_tries["durable_pod"]
    pods = outcome.pods_of("mw_long", "durable_pod")
    [pod] = [p for p in pods if try_of(p) == killed]
    assert pod.end == "Succeeded", (
        f"the retry did not re-attach to {pod.describe()}, which ended {pod.end}"
        " (if it ended on its own first: raise GPUPOOL_MW_FIRST_TRY_POD_SECONDS)"
    )
    assert [p.describe() for p in pods if try_of(p) != killed] == [], "a retry ran a pod of its own"
    granted = [r for r in outcome.reservations_of("mw_long", "durable_pod") if r.grant is not None]
    assert [r.id for r in granted] == [pod.reservation_id], "not one grant in the history"
    [grant] = granted
    assert grant.state is ReservationState.RELEASED, grant
    assert f"/try-{killed}@" not in grant.holder, f"the grant was not adopted by the retry: {grant.holder}"


def check_fresh_start(outcome: Outcome) -> None:
    """``durable=False``: the killed try's pod was deleted and its grant freed before the retry reserved."""
    killed = outcome.killed_tries["ephemeral_pod"]
    pods = outcome.pods_of("mw_long", "ephemeral_pod")
    [old] = [p for p in pods if try_of(p) == killed]
    later = [p for p in pods if try_of(p) > killed]
    assert old.end == "Deleted" and old.ended_at is not None, (
        f"{old.describe()} ended {old.end}, not deleted (if it ended on its own first: raise GPUPOOL_MW_FIRST_TRY_POD_SECONDS)"
    )
    assert later and all(p.created_at >= old.ended_at for p in later), (
        "a new pod ran before the old one was deleted"
    )
    reservations = outcome.reservations_of("mw_long", "ephemeral_pod")
    [freed] = [r for r in reservations if r.id == old.reservation_id]
    newer = [r for r in reservations if r.created_at > freed.created_at]
    assert freed.state is ReservationState.RELEASED and freed.ended_at is not None, freed
    assert newer and all(r.created_at >= freed.ended_at for r in newer), (
        "the retry reserved before the old grant was freed"
    )
    assert all(r.grant is not None for r in newer), "the retry got no grant of its own"
