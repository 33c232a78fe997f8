"""GpuJobOperator end to end: a gang of 3 pods, one Indexed Job, ``dag.test()`` on the emulator and a real ledger."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from airflow_gpupool.exceptions import ConfigurationError, InvalidGangError
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.operators import GpuJobOperator
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.integration.conftest import A100, cluster_nodes
from tests.ledger_fixtures import node

INDEX = "batch.kubernetes.io/job-completion-index"
NODES = ("gpu-a", "gpu-b")


@pytest.fixture
def gang_k8s(emulator: KubernetesEmulatorServer) -> Iterator[KubernetesEmulatorServer]:
    """The emulator with two A100 nodes of 2 GPUs each: a gang of 3 spans both."""
    emulator.reset(nodes=[gpu_node(n, gpus=2, product=A100, memory_mib=81920, pool="a100") for n in NODES])
    yield emulator
    emulator.reset(nodes=cluster_nodes())


def open_gang_ledger(url: str, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    ledger = Ledger.create(url)
    ledger.upsert_nodes([node(n, gpus=2, model=A100, cpu=96000, mem=1048576, pool="a100") for n in NODES])
    extra = {"ledger_url": url, "poll_interval_seconds": 0.2}
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", json.dumps({"conn_type": "gpupool", "extra": extra}))
    return ledger


@pytest.fixture
def gang_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    ledger = open_gang_ledger(f"sqlite:///{tmp_path}/ledger.db", monkeypatch)
    yield ledger
    ledger.close()


def the_job(k8s: KubernetesEmulatorServer) -> dict[str, Any]:
    (job,) = k8s.jobs("default")
    return job


def leader_of(job: dict[str, Any]) -> str:
    return str(job["spec"]["template"]["metadata"]["annotations"]["gpupool.io/gang-reservation"])


def job_pod_versions(k8s: KubernetesEmulatorServer, job: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """Every stored version of each pod of the Job (the pods are deleted when the task ends), by index."""
    names = {
        p["metadata"]["name"]
        for r in k8s.requests
        if r.method == "PATCH" and r.path.startswith("/api/v1/namespaces/default/pods/")
        for p in [{"metadata": {"name": r.path.rsplit("/", 1)[1]}}]
    }
    versions: dict[int, list[dict[str, Any]]] = {}
    for name in names:
        history = k8s.pod_history(name)
        if (
            history
            and history[0]["metadata"]["labels"].get("batch.kubernetes.io/job-name")
            == job["metadata"]["name"]
        ):
            versions[int(history[0]["metadata"]["annotations"][INDEX])] = history
    return versions


def assert_pinned_to_members(k8s: KubernetesEmulatorServer, ledger: Ledger, job: dict[str, Any]) -> None:
    gang = ledger.gang(leader_of(job))
    versions = job_pod_versions(k8s, job)
    assert sorted(versions) == [0, 1, 2]
    for member in gang.members:
        assert member.grant is not None
        history = versions[int(member.gang_index or 0)]
        assert history[0]["spec"]["schedulingGates"] == [{"name": "gpupool.io/reservation"}]  # created gated
        scheduled = [v for v in history if v["spec"].get("nodeName")]
        assert scheduled, f"member {member.id}'s pod never ran"
        for version in scheduled:  # never on a node while gated, always on its member's node
            assert not version["spec"].get("schedulingGates")
            assert version["spec"]["nodeName"] == member.grant.node
            assert version["metadata"]["annotations"]["gpupool.io/reservation-id"] == member.id
            assert version["metadata"]["annotations"]["gpupool.io/gpus"] == ",".join(
                map(str, member.grant.gpu_indices)
            )
        assert scheduled[-1]["status"]["phase"] in ("Running", "Succeeded", "Failed")
    assert sorted(m.grant.node for m in gang.members if m.grant) == ["gpu-a", "gpu-a", "gpu-b"]


def assert_gang_released(ledger: Ledger, job: dict[str, Any]) -> None:
    gang = ledger.gang(leader_of(job))
    assert [m.state for m in gang.members] == [ReservationState.RELEASED] * 3
    assert ledger.snapshot().grants == ()
    assert ledger.check_invariants() == []


@pytest.mark.parametrize("dag_id", ["gang_job", "gang_job_deferrable"])
def test_a_gang_of_three_runs_each_pod_pinned_to_its_member(
    gang_k8s: KubernetesEmulatorServer, gang_ledger: Ledger, run_dag: Callable[[str], Any], dag_id: str
) -> None:
    run = run_dag(dag_id)
    assert run.state == "success"
    job = the_job(gang_k8s)
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == (
        "Indexed",
        3,
        3,
    )
    assert job["status"]["succeeded"] == 3
    assert_pinned_to_members(gang_k8s, gang_ledger, job)
    assert_gang_released(gang_ledger, job)
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    name = job["metadata"]["name"]
    assert env["MASTER_ADDR"]["value"] == env["PET_MASTER_ADDR"]["value"] == f"{name}-0.{name}"
    assert (env["WORLD_SIZE"]["value"], env["PET_NNODES"]["value"], env["MASTER_PORT"]["value"]) == (
        "3",
        "3",
        "29500",
    )
    index_ref = f"metadata.annotations['{INDEX}']"
    assert env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == index_ref
    assert env["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == index_ref
    assert (
        env["GPUPOOL_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.annotations['gpupool.io/node']"
    )
    assert job["spec"]["template"]["spec"]["subdomain"] == name
    assert job["spec"]["template"]["metadata"]["labels"]["gpupool.io/gang-reservation"] == leader_of(job)
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"


def test_the_core_case_on_postgresql(
    gang_k8s: KubernetesEmulatorServer,
    pg_schema_url: str,
    monkeypatch: pytest.MonkeyPatch,
    run_dag: Callable[[str], Any],
) -> None:
    ledger = open_gang_ledger(pg_schema_url, monkeypatch)
    try:
        assert run_dag("gang_job_deferrable").state == "success"
        job = the_job(gang_k8s)
        assert_pinned_to_members(gang_k8s, ledger, job)
        assert_gang_released(ledger, job)
    finally:
        ledger.close()


def test_a_gang_the_pool_cannot_hold_never_ungates_a_pod_and_times_out(
    gang_k8s: KubernetesEmulatorServer, gang_ledger: Ledger, run_dag: Callable[[str], Any]
) -> None:
    gang_ledger.reserve(GpuRequest(gpus=2), "someone else", reservation_id="busy")  # 2 of 4 GPUs held
    run = run_dag("gang_job_too_busy")
    assert run.state == "failed"
    assert gang_k8s.jobs("default") == [] and gang_k8s.pods("default") == []  # no Job, no pod, ever
    assert not [r for r in gang_k8s.requests if r.method in ("POST", "PATCH")]
    assert gang_ledger.get("busy").state is ReservationState.GRANTED  # the other holder is untouched
    assert [r.id for r in gang_ledger.snapshot().queue] == []  # the gang withdrew
    assert gang_ledger.check_invariants() == []


def test_a_queued_gang_runs_once_capacity_frees(
    gang_k8s: KubernetesEmulatorServer, gang_ledger: Ledger, run_dag: Callable[[str], Any]
) -> None:
    gang_ledger.reserve(GpuRequest(gpus=2), "someone else", reservation_id="busy")
    released = threading.Timer(1.5, lambda: gang_ledger.release("busy", reason="done"))
    released.start()
    try:
        run = run_dag("gang_job_queued")
    finally:
        released.cancel()
    assert run.state == "success"
    job = the_job(gang_k8s)
    first_job_request = next(
        r.time for r in gang_k8s.requests if r.method == "POST" and r.path.endswith("/jobs")
    )
    freed_at = gang_ledger.get("busy").ended_at
    assert freed_at is not None
    assert first_job_request >= freed_at  # the Job exists only once the gang is granted
    assert_pinned_to_members(gang_k8s, gang_ledger, job)
    assert_gang_released(gang_ledger, job)


def test_a_failed_job_fails_the_task_and_releases_the_gang(
    gang_k8s: KubernetesEmulatorServer, gang_ledger: Ledger, run_dag: Callable[[str], Any]
) -> None:
    run = run_dag("gang_job_failing")
    assert run.state == "failed"
    job = the_job(gang_k8s)
    assert any(c["type"] == "Failed" and c["status"] == "True" for c in job["status"]["conditions"])
    assert_gang_released(gang_ledger, job)


def test_arguments_the_gang_decides_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="parallelism=3"):
        GpuJobOperator(task_id="t", members=3, gpus=1, image="x", parallelism=2)
    with pytest.raises(ConfigurationError, match="wait_until_job_complete"):
        GpuJobOperator(task_id="t", members=3, gpus=1, image="x", wait_until_job_complete=False)
    with pytest.raises(InvalidGangError):
        GpuJobOperator(task_id="t", members=0, gpus=1, image="x")
    op = GpuJobOperator(task_id="t", members=2, gpus=1, image="x", completions=2)
    request = op.gpu_request()
    assert request.gang is not None and (request.gang.members, request.gang.min_members) == (2, 2)
    assert (op.completion_mode, op.completions, op.parallelism, op.backoff_limit) == ("Indexed", 2, 2, 0)


def test_on_kill_deletes_the_job_and_releases_the_gang(
    gang_k8s: KubernetesEmulatorServer, gang_ledger: Ledger
) -> None:
    from kubernetes import client, config

    batch = client.BatchV1Api(config.new_client_from_config(gang_k8s.kubeconfig_path))
    gang_ledger.reserve(
        GpuJobOperator(task_id="t", members=3, gpus=1, image="x").gpu_request(), "me", reservation_id="g"
    )
    body = {
        "metadata": {"name": "job-killed", "namespace": "default"},
        "spec": {
            "template": {
                "metadata": {"annotations": {"gpupool.emulator/duration-seconds": "30"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "base", "image": "x"}]},
            }
        },
    }
    created = batch.create_namespaced_job("default", body)
    op = GpuJobOperator(
        task_id="t", members=3, gpus=1, image="x", config_file=gang_k8s.kubeconfig_path, in_cluster=False
    )
    op._held_id, op.job = "g", created
    op.on_kill()
    assert gang_k8s.job("job-killed") is None and gang_k8s.pods("default") == []
    assert [m.state for m in gang_ledger.gang("g").members] == [ReservationState.RELEASED] * 3


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
    releaser, seen = release_a_member_once_running(gang_k8s, gang_ledger, member)
    started = time.monotonic()
    run = run_dag(dag_id)
    took = time.monotonic() - started
    releaser.join(timeout=5)

    assert run.state == "failed"
    assert seen["result"].released
    assert took < 45  # the pods would have run 60 s: the Job was deleted at once
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
