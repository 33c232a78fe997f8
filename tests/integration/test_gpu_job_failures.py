"""GpuJobOperator when things go wrong under the Job: a lost lease, a member's pod that fails and is
replaced, reconcile meanwhile. ``dag.test()`` on the emulator, real SQLite and PostgreSQL ledgers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from airflow_gpupool.ledger import Ledger
from airflow_gpupool.operators import GpuJobOperator
from airflow_gpupool.testing import KubernetesEmulatorServer
from tests.integration import gang_jobs
from tests.integration.gang_jobs import (
    INDEX,
    assert_gang_released,
    leader_of,
    open_gang_ledger,
    the_job,
)

# The shared fixtures, found by pytest under these names.
gang_k8s = gang_jobs.gang_k8s
gang_ledger = gang_jobs.gang_ledger


def release_a_member_once_running(
    k8s: KubernetesEmulatorServer, ledger: Ledger, member: int
) -> tuple[threading.Thread, dict[str, Any]]:
    """Start a thread that releases one member of the gang, as someone else would, once every pod runs."""
    seen: dict[str, Any] = {}

    def all_running(pods: list[dict[str, Any]]) -> bool:
        return len(pods) == 3 and all(p["status"].get("phase") == "Running" for p in pods)

    def run() -> None:
        pods = k8s.wait_for_pods(all_running, timeout=60)
        leader = pods[0]["metadata"]["annotations"]["gpupool.io/gang-reservation"]
        seen["leader"] = leader
        seen["pods"] = sorted(p["metadata"]["name"] for p in pods)
        victim = leader if member == 0 else f"{leader}.{member}"
        seen["result"] = ledger.release(victim, reason="taken back by an operator")

    thread = threading.Thread(target=run, name="release-member", daemon=True)
    thread.start()
    return thread, seen


@pytest.mark.parametrize(
    ("dag_id", "member"),
    [
        ("gang_job_lease_lost", 1),
        ("gang_job_lease_lost_deferrable", 2),
        ("gang_job_lease_lost_deferrable", 0),
    ],
)
def test_a_lost_lease_deletes_the_job_and_fails_the_try(
    gang_k8s: KubernetesEmulatorServer,
    gang_ledger: Ledger,
    run_dag: Callable[[str], Any],
    capfd: pytest.CaptureFixture[str],
    dag_id: str,
    member: int,
) -> None:
    check_lost_lease(gang_k8s, gang_ledger, run_dag, capfd, dag_id, member)


def test_a_lost_lease_on_postgresql(
    gang_k8s: KubernetesEmulatorServer,
    pg_schema_url: str,
    monkeypatch: pytest.MonkeyPatch,
    run_dag: Callable[[str], Any],
    capfd: pytest.CaptureFixture[str],
) -> None:
    ledger = open_gang_ledger(pg_schema_url, monkeypatch)
    try:
        check_lost_lease(gang_k8s, ledger, run_dag, capfd, "gang_job_lease_lost_deferrable", 1)
    finally:
        ledger.close()


def check_lost_lease(
    gang_k8s: KubernetesEmulatorServer,
    gang_ledger: Ledger,
    run_dag: Callable[[str], Any],
    capfd: pytest.CaptureFixture[str],
    dag_id: str,
    member: int,
) -> None:
    # Each pod takes 1 s to exit on SIGTERM: the gang is released only once they are gone.
    gang_k8s.configure_pod(sigterm_exit_seconds=1.0)
    releaser, seen = release_a_member_once_running(gang_k8s, gang_ledger, member)
    started = time.monotonic()
    run = run_dag(dag_id)
    took = time.monotonic() - started
    releaser.join(timeout=5)

    assert run.state == "failed"
    assert seen["result"].released
    assert took < 45  # the pods would have run 60 s: the Job was deleted at once
    # Gone before the run ended: the gang was released only once its terminating pods had gone.
    assert gang_k8s.jobs("default") == [] and gang_k8s.pods("default") == []
    deletes = [r for r in gang_k8s.requests if r.method == "DELETE" and "/jobs/" in r.path]
    assert deletes, "the Job was not deleted"
    for name in seen["pods"]:
        assert [p["status"].get("phase") for p in gang_k8s.pod_history(name)][-1] != "Succeeded"
    leader = seen["leader"]
    gang = gang_ledger.gang(leader)
    assert all(not m.state.holds for m in gang.members)
    assert "LeaseLostError" in gang.members[0].message or member == 0
    out, err = capfd.readouterr()
    assert f"LeaseLostError: the task failed: lease_lost (lease of {leader} lost: " in out + err
    assert gang_ledger.snapshot().grants == ()
    assert gang_ledger.check_invariants() == []


def fail_first_pod_of_index(k8s: KubernetesEmulatorServer, index: int) -> dict[str, str]:
    """Tell the kubelet to fail the first pod of one completion index, once; return that pod's uid, once seen."""
    first: dict[str, str] = {}

    def is_first(pod: Mapping[str, Any]) -> bool:
        meta = pod.get("metadata") or {}
        if (meta.get("annotations") or {}).get(INDEX) != str(index):
            return False
        return first.setdefault("uid", meta["uid"]) == meta["uid"]

    k8s.configure_pod(predicate=is_first, exit_code=1)
    return first


def delete_job(k8s: KubernetesEmulatorServer, job: dict[str, Any]) -> None:
    from kubernetes import client, config

    batch = client.BatchV1Api(config.new_client_from_config(k8s.kubeconfig_path))
    batch.delete_namespaced_job(job["metadata"]["name"], "default", propagation_policy="Foreground")


@pytest.mark.parametrize("dag_id", ["gang_job_replaced", "gang_job_replaced_deferrable"])
def test_a_replacement_pod_is_pinned_to_the_same_member(
    gang_k8s: KubernetesEmulatorServer, gang_ledger: Ledger, run_dag: Callable[[str], Any], dag_id: str
) -> None:
    check_replacement(gang_k8s, gang_ledger, run_dag, dag_id)


def test_a_replacement_pod_on_postgresql(
    gang_k8s: KubernetesEmulatorServer,
    pg_schema_url: str,
    monkeypatch: pytest.MonkeyPatch,
    run_dag: Callable[[str], Any],
) -> None:
    ledger = open_gang_ledger(pg_schema_url, monkeypatch)
    try:
        check_replacement(gang_k8s, ledger, run_dag, "gang_job_replaced_deferrable")
    finally:
        ledger.close()


def check_replacement(
    gang_k8s: KubernetesEmulatorServer, gang_ledger: Ledger, run_dag: Callable[[str], Any], dag_id: str
) -> None:
    failed = fail_first_pod_of_index(gang_k8s, 1)
    # A replacement left gated would keep the Job running for ever: end it, so the test fails instead.
    watchdog = threading.Timer(30, lambda: [delete_job(gang_k8s, j) for j in gang_k8s.jobs("default")])
    watchdog.start()
    try:
        run = run_dag(dag_id)
    finally:
        watchdog.cancel()
        gang_k8s.clear_pod_rules()
    assert run.state == "success"
    job = the_job(gang_k8s)
    assert (job["spec"]["backoffLimit"], job["status"]["failed"], job["status"]["succeeded"]) == (1, 1, 3)
    patched = {
        r.path.rsplit("/", 1)[1] for r in gang_k8s.requests if r.method == "PATCH" and "/pods/" in r.path
    }
    index_1 = [gang_k8s.pod_history(n) for n in patched]
    index_1 = [h for h in index_1 if h[0]["metadata"]["annotations"].get(INDEX) == "1"]
    assert len(index_1) == 2, "index 1 had its failed pod and its replacement, each pinned"
    old = next(h for h in index_1 if h[0]["metadata"]["uid"] == failed["uid"])
    history = next(h for h in index_1 if h[0]["metadata"]["uid"] != failed["uid"])
    assert (old[-1]["status"]["phase"], history[-1]["status"]["phase"]) == ("Failed", "Succeeded")
    member = gang_ledger.gang(leader_of(job)).members[1]
    assert member.grant is not None
    assert history[0]["spec"]["schedulingGates"] == [{"name": "gpupool.io/reservation"}]  # created gated
    ended = [v for v in old if v["status"].get("phase") == "Failed"][0]["metadata"]["resourceVersion"]
    pinned = [v for v in history if not v["spec"].get("schedulingGates")][0]["metadata"]["resourceVersion"]
    assert int(pinned) > int(ended)  # the member was handed over only once its old pod ended
    for version in (v for v in history if v["spec"].get("nodeName")):
        assert version["spec"]["nodeName"] == member.grant.node
        assert version["metadata"]["annotations"]["gpupool.io/reservation-id"] == member.id
        assert version["metadata"]["annotations"]["gpupool.io/gpus"] == ",".join(
            map(str, member.grant.gpu_indices)
        )
    assert_gang_released(gang_ledger, job)


def test_reconcile_keeps_a_member_whose_replacement_waits_gated(
    gang_k8s: KubernetesEmulatorServer, gang_ledger: Ledger
) -> None:
    from airflow_gpupool.controller.reconcile import reconcile
    from airflow_gpupool.inventory.sync import core_v1_api

    core = core_v1_api(gang_k8s.kubeconfig_path)
    request = GpuJobOperator(task_id="t", members=3, gpus=1, image="x").gpu_request()
    gang_ledger.reserve(request, "me", reservation_id="gp-g")

    def create(name: str, labels: dict[str, str], index: int, **annotations: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "metadata": {"name": name, "labels": labels, "annotations": {INDEX: str(index), **annotations}},
            "spec": {"containers": [{"name": "base", "image": "x"}]},
        }
        if not labels.get("gpupool.io/reservation-id"):
            body["spec"]["schedulingGates"] = [{"name": "gpupool.io/reservation"}]
        created = core.create_namespaced_pod("default", body)
        return {"uid": created.metadata.uid}

    for index, member in enumerate(("gp-g", "gp-g.1", "gp-g.2")):
        fails = index == 1  # member 1's pod fails at once; the others run on
        created = create(
            f"m{index}",
            {"gpupool.io/reservation-id": member},
            index,
            **{
                "gpupool.emulator/exit-code": "1" if fails else "0",
                "gpupool.emulator/duration-seconds": "0.1" if fails else "60",
            },
        )
        gang_ledger.bind(member, namespace="default", name=f"m{index}", uid=created["uid"])
    gang_k8s.wait_for_pod("m1", ("Failed",))
    create("m1-replacement", {"gpupool.io/gang-reservation": "gp-g"}, 1)

    kept = reconcile(gang_ledger, core, grace_seconds=0)
    assert "gp-g.1" in kept.kept and not kept.released
    core.delete_namespaced_pod("m1-replacement", "default")
    gone = reconcile(gang_ledger, core, grace_seconds=0)
    assert [rid for rid, _ in gone.released] == ["gp-g.1"]  # without its replacement, its member is freed
