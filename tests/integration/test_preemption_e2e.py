"""Preemption with a checkpoint grace end to end: real dag.test(), the real KubernetesPodOperator over
HTTP to the emulator, a real SQLite ledger.

The victim is preemptible training on the whole A100 node (``ckpt_preemptible``); urgent work
asks for that node while it runs. The victim's operator sees the notice at its next look, deletes
its pod with the remaining grace, the emulator's kubelet writes an emergency checkpoint on
SIGTERM, the operator releases the slice once the pod is gone, and only then is the urgent
request granted. The victim's retry (``preempts=False``) waits for the urgent work to end and
resumes from the emergency checkpoint.

The emulator deletes as Kubernetes does (the ``DELETE`` answers at once, the pod terminates for as
long as its containers take to exit on SIGTERM): the victim takes :data:`VICTIM_EXIT_S` to write
its emergency checkpoint and exit, and the urgent work starts a pod on the GPUs it is granted.
From the emulator's pod history, the two pods never share a GPU and the emergency checkpoint is
written before the urgent pod starts (a slice released when the ``DELETE`` answers fails both).
The urgent pod is pinned by the ledger's GPU indices and placed by node name: Kubernetes counts
GPUs but cannot tell them apart, so only the hand-off keeps the two apart.

Nothing here depends on how fast a loaded machine is: the waits end on what they wait for (the
first one spans dag.test()'s start, tens of seconds under load), the first try's pod runs long
enough that only the preemption ends it, and its grace is checked against the deadline the
ledger gave, not a guess of how soon the notice came.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_gpupool.ledger import Ledger, ReservationState, TaskAttempts
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer
from airflow_gpupool.testing.pods.pod_history import gpu_overlaps
from tests.integration.conftest import A100

URGENT = "urgent-inference-test"
URGENT_POD = "urgent-inference"
#: How long the victim's containers take to write the emergency checkpoint and exit on SIGTERM.
VICTIM_EXIT_S = 3.0


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}


#: How long the DAG run may take to launch the first pod (dag.test()'s own start included).
LAUNCH_TIMEOUT_S = 300.0


def wait_until(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class UrgentWork(threading.Thread):
    """Once the victim's pod runs and has checkpointed, reserve its node for urgent work; record
    what was on disk and in the cluster when the grant came, then release it."""

    def __init__(self, k8s: KubernetesEmulatorServer, url: str) -> None:
        super().__init__(name="urgent-work", daemon=True)
        self.k8s, self.url = k8s, url
        self.seen: dict[str, Any] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # reported by the test
            self.error = e

    def _run(self) -> None:
        first = wait_until("the victim's pod", lambda: self.k8s.created_pods(), LAUNCH_TIMEOUT_S)[0]
        name = first["metadata"]["name"]
        self.k8s.wait_for_pod(name, ("Running",), timeout=60)
        root = Path(env_of(first)["GPUPOOL_CHECKPOINT_DIR"])
        wait_until("the victim's first checkpoint", lambda: (root / "step-000001" / "manifest.json").exists())
        # min_runtime 0: this ledger, serving the queue, may preempt a grant that just started.
        ledger = Ledger.create(self.url, min_runtime_seconds=0)
        try:
            victim_id = first["metadata"]["labels"]["gpupool.io/reservation-id"]
            # The renewer (sync) or LeasedPodTrigger (deferrable) tells the ledger at its next round.
            wait_until("the checkpoint reported", lambda: ledger.get(victim_id).checkpoint_at)
            urgent = GpuRequest(gpus=4, gpu_models=frozenset({A100}), priority=100, team="inference")
            self.seen["reserved"] = ledger.reserve(urgent, URGENT, reservation_id=URGENT, ttl=120).state
            self.seen["victim"] = ledger.get(victim_id)
            granted = wait_until(
                "the urgent grant", lambda: (r := ledger.get(URGENT)).state is ReservationState.GRANTED and r
            )
            self.seen["granted_at"] = granted.grant.granted_at
            self.seen["victim_pod_at_grant"] = self.k8s.pod(name)
            self._run_urgent_pod(granted.grant.node, granted.grant.gpu_indices)
            emergency = {
                p.parent.name: json.loads(p.read_text())
                for p in root.glob("step-*/manifest.json")
                if json.loads(p.read_text()).get("emergency")
            }
            self.seen["emergency"] = sorted(emergency)
            self.seen["emergency_at"] = [
                datetime.datetime.fromisoformat(m["time"]).timestamp() for m in emergency.values()
            ]
            self.seen["victim_after"] = ledger.get(victim_id)
            self.k8s.wait_for_pod(URGENT_POD, timeout=30)  # its GPUs are free again before the release
            ledger.release(URGENT, reason="urgent work done")
        finally:
            ledger.close()

    def _run_urgent_pod(self, node: str, gpus: tuple[int, ...]) -> None:
        """Start the urgent work's pod on its granted GPUs, at once, as its operator would."""
        from kubernetes import client, config

        core = client.CoreV1Api(config.new_client_from_config(self.k8s.kubeconfig_path))
        env = [{"name": "GPUPOOL_GPU_INDICES", "value": ",".join(map(str, gpus))}]
        core.create_namespaced_pod(
            "default",
            {
                "metadata": {
                    "name": URGENT_POD,
                    "labels": {"gpupool.io/reservation-id": URGENT},
                    "annotations": {"gpupool.emulator/duration-seconds": "1"},
                },
                "spec": {
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "containers": [{"name": "serve", "image": "inference:1", "env": env}],
                },
            },
        )


@pytest.mark.parametrize("dag_id", ["ckpt_preemptible", "ckpt_preemptible_deferrable"])
def test_a_preempted_step_checkpoints_in_its_grace_and_its_retry_resumes_there(
    run_dag: Any,
    k8s: KubernetesEmulatorServer,
    gpu_ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
    dag_id: str,
) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__MIN_RUNTIME_SECONDS", "0")
    # The first try would run 3 minutes (a step every ~4 s; the preemption comes within seconds,
    # so only a broken one lets it end); its retry runs the DAG's six steps from the emergency
    # checkpoint on at once.
    k8s.configure_pod(
        predicate=lambda pod: pod["metadata"]["labels"].get("try_number") == "1",
        duration_seconds=180,
        checkpoint_steps=41,
        sigterm_exit_seconds=VICTIM_EXIT_S,
    )
    urgent = UrgentWork(k8s, gpu_ledger.url)
    urgent.start()

    dag_run = run_dag(dag_id)
    urgent.join(timeout=60)  # the retry ran after the urgent release: only the thread's end is left
    assert not urgent.is_alive() and urgent.error is None, urgent.error

    seen = urgent.seen
    # The cluster's side first, from the emulator's pod history: the urgent pod started only once
    # the victim's containers had exited, after its emergency checkpoint, and no GPU was shared.
    records = {r.name: r for r in k8s.pod_records()}
    first_pod, urgent_pod = records[k8s.created_pods()[0]["metadata"]["name"]], records[URGENT_POD]
    assert urgent_pod.node == first_pod.node and urgent_pod.gpus.devices == first_pod.gpus.devices
    assert gpu_overlaps(records.values()) == []
    (emergency_at,) = seen["emergency_at"]
    assert urgent_pod.started_at is not None and first_pod.ended_at is not None
    assert emergency_at < urgent_pod.started_at, (emergency_at, urgent_pod.started_at)
    assert first_pod.ended_at <= urgent_pod.started_at
    # The urgent request waited while the victim had its grace, and took the slice only once
    # the victim's pod was gone, its emergency checkpoint written.
    assert seen["reserved"] is ReservationState.WAITING
    victim = seen["victim"]
    assert victim.state is ReservationState.PREEMPTING and victim.preempted_by == URGENT
    assert victim.request.checkpoint_on_sigterm is True  # the operator's flag, stored in the ledger
    assert seen["victim_pod_at_grant"] is None
    assert len(seen["emergency"]) == 1
    assert seen["victim_after"].state is ReservationState.PREEMPTED
    # Reported as it renewed (sync renewer or LeasedPodTrigger), before the notice.
    assert victim.checkpoint_at is not None and victim.checkpoint_at <= seen["granted_at"]
    # Once its pod was gone and before its release, the victim reported the emergency checkpoint:
    # the ledger knows how much work the preemption really took.
    assert seen["victim_after"].checkpoint_at >= emergency_at > victim.checkpoint_at

    (ti,) = dag_run.get_task_instances()
    assert str(ti.state) == "success" and ti.try_number == 2
    first, retry = [p for p in k8s.created_pods() if p["metadata"]["name"] != URGENT_POD]
    root = Path(env_of(first)["GPUPOOL_CHECKPOINT_DIR"])
    emergency_step = seen["emergency"][0]
    assert env_of(retry)["GPUPOOL_RESUME_FROM"] == f"{root}/{emergency_step}"
    assert (root / "COMPLETE").exists()
    # The pod was ended with what was left of its 20 s grace (rounded up), before the deadline,
    # not at once (KPO's own clean-up delete comes after, when the pod is gone already).
    deletes = [
        r
        for r in k8s.requests
        if r.method == "DELETE" and r.path.endswith(f"/pods/{first['metadata']['name']}")
    ]
    first_grace = deletes[0].query.get("gracePeriodSeconds") or (deletes[0].body or {}).get(
        "gracePeriodSeconds"
    )
    deadline = victim.preempt_deadline
    assert deadline is not None and deletes[0].time < deadline, (deletes[0], deadline)
    assert max(1, deadline - deletes[0].time) <= int(first_grace) <= 20, (deletes[0], deadline)
    (attempt,) = TaskAttempts(gpu_ledger).history(f"{dag_id}/train/{dag_run.run_id}/map--1")
    assert (attempt.failure_class, attempt.remedy) == ("preempted", "retry")
    assert attempt.reservation_id == victim.id
    # The retry's request preempts nobody (no cascade), and nothing is held at the end.
    retry_rid = retry["metadata"]["labels"]["gpupool.io/reservation-id"]
    assert gpu_ledger.get(retry_rid).request.preempts is False
    snap = gpu_ledger.snapshot()
    assert snap.grants == () and snap.queue == ()
    assert gpu_ledger.check_invariants() == []
