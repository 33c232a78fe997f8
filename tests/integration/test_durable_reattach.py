"""A worker SIGKILLed mid-pod, then the retry: ``durable=True`` adopts the grant of the pod it
re-attaches to; ``durable=False`` deletes the old pod and frees its grant before reserving.

The first try runs in its own process (``dag.test()``), killed with SIGKILL while its pod runs:
nothing of it gets to clean up. The retry is a second ``dag.test()`` of the same run, in a new
process as on a new worker. Real Airflow, the real KubernetesPodOperator over HTTP to the
emulator, a real SQLite and a real PostgreSQL ledger.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.task_try import TaskTry
from airflow_gpupool.testing import KubernetesEmulatorServer
from tests.integration.conftest import ledger_inventory

_RUN = """
import sys
from datetime import datetime
from airflow.dag_processing.dagbag import DagBag
when = datetime.fromisoformat(sys.argv[3])
DagBag(sys.argv[1]).get_dag(sys.argv[2]).test(logical_date=when, run_after=when)
"""


def _wait(what: str, check: Callable[[], Any], timeout: float, process: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if process.poll() is not None:
            out = process.stdout.read().decode(errors="replace") if process.stdout else ""
            raise AssertionError(f"the first try exited ({process.returncode}) before {what}:\n{out[-4000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def run_command(dag_id: str, logical_date: datetime) -> list[str]:
    """The command that runs one ``dag.test()`` of the DAG run at ``logical_date``, as a worker would."""
    return [
        sys.executable,
        "-c",
        _RUN,
        os.environ["AIRFLOW__CORE__DAGS_FOLDER"],
        dag_id,
        logical_date.isoformat(),
    ]


def kill_first_try_mid_pod(
    dag_id: str, logical_date: datetime, k8s: KubernetesEmulatorServer, ledger: Ledger
) -> tuple[dict[str, Any], str]:
    """Run try 1 in a process of its own; SIGKILL it once its pod runs and is bound; return pod and grant."""
    process = subprocess.Popen(
        run_command(dag_id, logical_date),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        selector = f"dag_id={dag_id}"

        def running_pod() -> dict[str, Any] | None:
            pods = [
                p
                for p in k8s.pods("default", label_selector=selector)
                if p["status"].get("phase") == "Running"
            ]
            return pods[0] if pods else None

        pod = _wait("its pod to run", running_pod, 240, process)
        rid = pod["metadata"]["labels"]["gpupool.io/reservation-id"]
        _wait("the grant to be bound", lambda: (ledger.get(rid).grant or _Unbound).pod_uid, 120, process)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    return pod, rid


class _Unbound:
    pod_uid = None


def run_id_of(logical_date: datetime) -> str:
    """The run id ``dag.test()`` gives the DAG run at ``logical_date`` (run_after the same)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType

    return DagRun.generate_run_id(
        run_type=DagRunType.MANUAL, logical_date=logical_date, run_after=logical_date
    )


def fail_running_try(dag_id: str, logical_date: datetime) -> None:
    """Do what the scheduler does when a task's heartbeat stops: the running try has failed."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    with create_session() as session:
        ti = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == dag_id,
                TaskInstance.run_id == run_id_of(logical_date),
                TaskInstance.state == TaskInstanceState.RUNNING,
            )
        ).one()
        ti.state = TaskInstanceState.FAILED


def run_retry(
    dag_id: str, logical_date: datetime, k8s: KubernetesEmulatorServer, ledger: Ledger
) -> tuple[str, int, str]:
    """Run the retry in a new process, as a new worker would; return its state, try number and run id.

    The pods run until told: once the retry's pod (the re-attached one, or its own) runs on a
    grant the retry holds and the retry follows its log, the emulator ends it, so no timing
    decides what the test sees. (The grant passes to the retry before the parent re-attaches:
    a pod ended in between is one the parent deletes and creates anew.)
    """
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    # The same logical date and run_after: the same DAG run, whose failed try is cleared and retried.
    started = time.time()
    process = subprocess.Popen(
        run_command(dag_id, logical_date),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def retry_pod() -> str | None:
            for pod in k8s.pods("default", label_selector=f"dag_id={dag_id}"):
                grant = ledger.get(pod["metadata"]["labels"]["gpupool.io/reservation-id"])
                bound = grant.grant is not None and grant.grant.pod_uid == pod["metadata"]["uid"]
                if pod["status"].get("phase") == "Running" and bound and "/try-2@" in grant.holder:
                    name = str(pod["metadata"]["name"])
                    if followed_since(name, started):
                        return name
            return None

        def followed_since(name: str, since: float) -> bool:
            """Whether the retry reads the pod's log: the parent has re-attached to it (or made it)."""
            log_path = f"/pods/{name}/log"
            return any(
                r.method == "GET" and r.path.endswith(log_path) and r.time >= since for r in k8s.requests
            )

        k8s.finish_pod(_wait("the retry's pod to run on its grant", retry_pod, 240, process))
        output_bytes, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    output = output_bytes.decode(errors="replace")
    assert process.returncode == 0, output[-4000:]
    run_id = run_id_of(logical_date)
    with create_session() as session:
        ti = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
        ).one()
        return str(ti.state), ti.try_number, ti.run_id


@pytest.fixture
def death_ledger(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    """A fresh ledger of the emulated cluster on each backend, named by the default gpupool connection."""
    ledger = Ledger.create(ledger_url)
    ledger.upsert_nodes(ledger_inventory())
    extra = {"ledger_url": ledger_url, "poll_interval_seconds": 0.2}
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", json.dumps({"conn_type": "gpupool", "extra": extra}))
    yield ledger
    ledger.close()


@pytest.fixture
def logical_date() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def test_durable_retry_adopts_the_grant_of_the_pod_it_reattaches_to(
    airflow_db: None, k8s: KubernetesEmulatorServer, death_ledger: Ledger, logical_date: datetime
) -> None:
    dag_id = "gpu_worker_death_durable"
    pod, rid = kill_first_try_mid_pod(dag_id, logical_date, k8s, death_ledger)
    first = death_ledger.get(rid)
    assert first.state in (ReservationState.GRANTED, ReservationState.ORPHANED)
    fail_running_try(dag_id, logical_date)

    state, try_number, run_id = run_retry(dag_id, logical_date, k8s, death_ledger)

    assert (state, try_number) == ("success", 2)
    # The retry ran on the first try's pod and slice: one pod, one grant, released once.
    name = pod["metadata"]["name"]
    assert [p["metadata"]["name"] for p in k8s.created_pods()].count(name) == 1
    assert len({p["metadata"]["uid"] for p in k8s.pod_history(name)}) == 1
    assert k8s.pod_history(name)[-1]["status"]["phase"] == "Succeeded"
    retry_rid = TaskTry(dag_id, "train", run_id, try_number=2).reservation_id
    assert death_ledger.get_or_none(retry_rid) is None
    adopted = death_ledger.get(rid)
    assert adopted.state is ReservationState.RELEASED
    assert "/try-2@" in adopted.holder
    assert adopted.grant is not None and first.grant is not None
    assert adopted.grant.gpu_indices == first.grant.gpu_indices
    assert adopted.grant.pod_uid == pod["metadata"]["uid"]
    snap = death_ledger.snapshot()
    assert snap.grants == () and snap.queue == ()
    assert death_ledger.check_invariants() == []


def test_not_durable_retry_deletes_the_old_pod_and_frees_its_grant_first(
    airflow_db: None, k8s: KubernetesEmulatorServer, death_ledger: Ledger, logical_date: datetime
) -> None:
    dag_id = "gpu_worker_death_not_durable"
    pod, rid = kill_first_try_mid_pod(dag_id, logical_date, k8s, death_ledger)
    fail_running_try(dag_id, logical_date)

    state, try_number, run_id = run_retry(dag_id, logical_date, k8s, death_ledger)

    assert (state, try_number) == ("success", 2)
    old_name = pod["metadata"]["name"]
    history = k8s.pod_history(old_name)
    assert history[-1]["status"].get("phase") != "Succeeded"  # deleted while it ran
    assert k8s.pod(old_name) is None
    old = death_ledger.get(rid)
    assert old.state is ReservationState.RELEASED
    assert old.message == f"try 2 starts afresh: pod {old_name} of try 1 deleted"
    retry_rid = TaskTry(dag_id, "train", run_id, try_number=2).reservation_id
    new = death_ledger.get(retry_rid)
    assert new.state is ReservationState.RELEASED
    # The old grant ended before the new one was made: never two slices for one task.
    assert old.ended_at is not None and new.created_at >= old.ended_at
    (new_pod,) = [p for p in k8s.created_pods() if p["metadata"]["labels"].get("dag_id") == dag_id][1:]
    assert new_pod["metadata"]["labels"]["gpupool.io/reservation-id"] == retry_rid
    snap = death_ledger.snapshot()
    assert snap.grants == () and snap.queue == ()
    assert death_ledger.check_invariants() == []
