"""batch/v1 Jobs on the emulator, through the real ``kubernetes`` client: pods, status, deletion."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from airflow_gpupool.testing import KubernetesEmulatorServer

INDEX = "batch.kubernetes.io/job-completion-index"


@pytest.fixture
def batch(k8s: KubernetesEmulatorServer) -> Any:
    from kubernetes import client, config

    return client.BatchV1Api(config.new_client_from_config(k8s.kubeconfig_path))


@pytest.fixture
def core(k8s: KubernetesEmulatorServer) -> Any:
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(k8s.kubeconfig_path))


def job_body(name: str, *, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations or {}},
                "spec": {
                    "restartPolicy": "Never",
                    "subdomain": "workers",
                    "containers": [{"name": "base", "image": "train:1"}],
                },
            },
            **spec,
        },
    }


def job_pods(k8s: KubernetesEmulatorServer, name: str) -> list[dict[str, Any]]:
    return k8s.pods("default", label_selector=f"batch.kubernetes.io/job-name={name}")


def condition(job: dict[str, Any]) -> tuple[str, str]:
    (ended,) = [c for c in job["status"]["conditions"] if c["status"] == "True"]
    return ended["type"], ended["reason"]


def test_indexed_job_runs_one_pod_per_index_and_completes(k8s: KubernetesEmulatorServer, batch: Any) -> None:
    created = batch.create_namespaced_job(
        "default", job_body("train", completionMode="Indexed", completions=3, parallelism=3)
    )
    uid = created.metadata.uid
    assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    pods = job_pods(k8s, "train")  # there as soon as the create is answered
    assert sorted(p["metadata"]["annotations"][INDEX] for p in pods) == ["0", "1", "2"]
    for pod in pods:
        meta, spec = pod["metadata"], pod["spec"]
        index = meta["annotations"][INDEX]
        assert meta["name"].startswith(f"train-{index}-")
        assert meta["labels"][INDEX] == index
        assert meta["labels"]["job-name"] == meta["labels"]["batch.kubernetes.io/job-name"] == "train"
        assert meta["labels"]["controller-uid"] == uid
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": "train",
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert (spec["hostname"], spec["subdomain"]) == (f"train-{index}", "workers")
        (env,) = spec["containers"][0]["env"]
        assert env == {
            "name": "JOB_COMPLETION_INDEX",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX}']"}},
        }
    job = k8s.wait_for_job("train")
    assert condition(job) == ("Complete", "CompletionsReached")
    status = batch.read_namespaced_job_status("train", "default").status
    assert (status.succeeded, status.active, status.failed, status.completed_indexes) == (3, 0, 0, "0-2")
    assert status.start_time is not None and status.completion_time is not None


def test_parallelism_limits_running_pods_until_completions_reached(
    k8s: KubernetesEmulatorServer, batch: Any
) -> None:
    batch.create_namespaced_job("default", job_body("steps", completions=3, parallelism=1))
    assert len(job_pods(k8s, "steps")) == 1
    job = k8s.wait_for_job("steps")
    assert condition(job)[0] == "Complete"
    assert job["status"]["succeeded"] == 3
    assert len(job_pods(k8s, "steps")) == 3
    assert all(INDEX not in p["metadata"].get("annotations", {}) for p in job_pods(k8s, "steps"))


def test_failed_pods_are_replaced_until_backoff_limit_then_the_job_fails(
    k8s: KubernetesEmulatorServer, batch: Any
) -> None:
    body = job_body("crash", annotations={"gpupool.emulator/exit-code": "1"}, backoffLimit=1)
    batch.create_namespaced_job("default", body)
    job = k8s.wait_for_job("crash")
    assert condition(job) == ("Failed", "BackoffLimitExceeded")
    assert job["status"]["failed"] == 2  # the first pod and one replacement
    assert job["status"].get("completionTime") is None
    assert [p["status"]["phase"] for p in job_pods(k8s, "crash")] == ["Failed", "Failed"]


def test_gated_template_keeps_its_pods_pending_until_ungated(
    k8s: KubernetesEmulatorServer, batch: Any, core: Any
) -> None:
    body = job_body("gated", completionMode="Indexed", completions=2, parallelism=2)
    body["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "gpupool.io/reservation"}]
    batch.create_namespaced_job("default", body)
    time.sleep(0.3)
    pods = job_pods(k8s, "gated")
    assert [p["status"]["phase"] for p in pods] == ["Pending", "Pending"]
    assert all(not p["spec"].get("nodeName") for p in pods)
    for pod in pods:
        core.patch_namespaced_pod(pod["metadata"]["name"], "default", {"spec": {"schedulingGates": []}})
    assert condition(k8s.wait_for_job("gated"))[0] == "Complete"


def long_job_with_slow_pods(k8s: KubernetesEmulatorServer, batch: Any, name: str) -> None:
    """A Job of two running pods that would run 30 s and take 2 s to exit on SIGTERM (grace 30 s)."""
    annotations = {"gpupool.emulator/duration-seconds": "30", "gpupool.emulator/sigterm-exit-seconds": "2"}
    batch.create_namespaced_job(
        "default", job_body(name, annotations=annotations, completions=2, parallelism=2)
    )
    for pod in job_pods(k8s, name):  # a pod not yet scheduled would be removed at once
        k8s.wait_for_pod(pod["metadata"]["name"], phases={"Running"})


def test_a_foreground_delete_keeps_the_job_marked_until_its_pods_are_gone(
    k8s: KubernetesEmulatorServer, batch: Any
) -> None:
    long_job_with_slow_pods(k8s, batch, "long")
    assert len(job_pods(k8s, "long")) == 2

    batch.delete_namespaced_job("long", "default", propagation_policy="Foreground")

    # As Kubernetes does: the Job is still there, marked, while its pods terminate; none is replaced.
    job = batch.read_namespaced_job("long", "default")
    assert job.metadata.deletion_timestamp is not None
    assert job.metadata.finalizers == ["foregroundDeletion"]
    pods = job_pods(k8s, "long")
    assert len(pods) == 2 and all(p["metadata"].get("deletionTimestamp") for p in pods)
    names = {p["metadata"]["name"] for p in pods}
    deadline = time.monotonic() + 20
    while k8s.job("long") is not None and time.monotonic() < deadline:
        # Until it is gone, the Job's pods are the terminating ones: no replacement is made.
        assert {p["metadata"]["name"] for p in job_pods(k8s, "long")} <= names
        time.sleep(0.05)
    assert k8s.job("long") is None
    assert job_pods(k8s, "long") == [] and all(k8s.pod(name) is None for name in names)


def test_a_background_delete_removes_the_job_at_once_and_its_pods_after(
    k8s: KubernetesEmulatorServer, batch: Any
) -> None:
    long_job_with_slow_pods(k8s, batch, "long")
    pods = job_pods(k8s, "long")
    assert len(pods) == 2

    batch.delete_namespaced_job("long", "default", propagation_policy="Background")

    assert k8s.job("long") is None
    names = [p["metadata"]["name"] for p in pods]
    terminating = [k8s.pod(name) for name in names]
    assert all(p is not None and p["metadata"].get("deletionTimestamp") for p in terminating)
    for name in names:
        k8s.wait_for_pod_gone(name, timeout=20)


def test_delete_without_propagation_orphans_the_pods(k8s: KubernetesEmulatorServer, batch: Any) -> None:
    body = job_body("kept", annotations={"gpupool.emulator/duration-seconds": "30"})
    batch.create_namespaced_job("default", body)
    batch.delete_namespaced_job("kept", "default")
    (pod,) = job_pods(k8s, "kept")
    assert "ownerReferences" not in pod["metadata"]


def test_list_get_patch_and_watch_jobs(k8s: KubernetesEmulatorServer, batch: Any) -> None:
    from kubernetes import watch

    batch.create_namespaced_job("default", job_body("paused", suspend=True))
    assert [j.metadata.name for j in batch.list_namespaced_job("default").items] == ["paused"]
    assert job_pods(k8s, "paused") == []
    assert batch.read_namespaced_job("paused", "default").status.start_time is None
    batch.patch_namespaced_job("paused", "default", {"spec": {"suspend": False}})
    assert len(job_pods(k8s, "paused")) == 1
    seen = []
    for event in watch.Watch().stream(
        batch.list_namespaced_job, "default", field_selector="metadata.name=paused", timeout_seconds=5
    ):
        conditions = event["object"].status.conditions or []
        seen.append(event["type"])
        if any(c.type == "Complete" for c in conditions):
            break
    assert seen[0] == "ADDED" and len(seen) >= 2


def test_missing_job_is_not_found(batch: Any) -> None:
    with pytest.raises(ApiException) as caught:
        batch.read_namespaced_job("nope", "default")
    assert caught.value.status == 404


@pytest.mark.parametrize("dag_id", ["plain_job", "plain_job_deferrable"])
def test_provider_job_operator_runs_an_indexed_job_to_completion(
    k8s: KubernetesEmulatorServer, run_dag: Any, dag_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": k8s.kubeconfig_path}}
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_EMULATOR", json.dumps(conn))
    run = run_dag(dag_id)
    assert run.state == "success"
    (job,) = k8s.jobs("default")
    assert job["metadata"]["name"].startswith("job-indexed")
    assert condition(job) == ("Complete", "CompletionsReached")
    assert job["status"]["succeeded"] == 2
    assert job["metadata"]["labels"]["dag_id"] == dag_id  # KPO's labels, so get_pods() found the pods
    # the operator read the pods by the job's labels, then deleted them (on_finish_action="delete_pod")
    assert job_pods(k8s, job["metadata"]["name"]) == []
    lists = [r for r in k8s.requests if r.method == "GET" and r.path == "/api/v1/namespaces/default/pods"]
    assert lists and "dag_id=" + dag_id in lists[0].query["labelSelector"]


def test_provider_job_operator_fails_with_the_job(k8s: KubernetesEmulatorServer, run_dag: Any) -> None:
    run = run_dag("plain_job_failing")
    assert run.state == "failed"
    (job,) = k8s.jobs("default")
    assert condition(job) == ("Failed", "BackoffLimitExceeded")
