"""The Kubernetes emulator under real clients: KubernetesPodOperator (sync and deferrable) and kubernetes."""

from __future__ import annotations

import asyncio
import datetime
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node

ANNOTATION = "gpupool.emulator/"


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    nodes = [
        gpu_node("gpu-a100-0", gpus=8, pool="a100"),
        gpu_node(
            "gpu-a100-1",
            gpus=7,
            mig={"1g.10gb": 7},
            pool="a100",
            taints=["nvidia.com/gpu=present:NoSchedule"],
        ),
        gpu_node("gpu-h100-0", gpus=8, product="NVIDIA-H100-80GB-HBM3", memory_mib=81559, pool="h100"),
    ]
    with KubernetesEmulatorServer(nodes=nodes, default_duration_seconds=0.3) as server:
        yield server


@pytest.fixture
def k8s(emulator: KubernetesEmulatorServer) -> KubernetesEmulatorServer:
    emulator.reset()
    return emulator


@pytest.fixture
def core(k8s: KubernetesEmulatorServer) -> Any:
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(k8s.kubeconfig_path))


class FakeTaskInstance:
    """The few task-instance fields KubernetesPodOperator reads, and an in-memory XCom."""

    def __init__(self, task_id: str) -> None:
        self.dag_id = "emulator_test"
        self.task_id = task_id
        self.run_id = "manual__2026-01-01T00:00:00+00:00"
        self.map_index = -1
        self.try_number = 1
        self.start_date = datetime.datetime.now(tz=datetime.UTC)
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def context_for(task_id: str) -> dict[str, Any]:
    ti = FakeTaskInstance(task_id)
    return {"ti": ti, "task_instance": ti, "run_id": ti.run_id, "dag": SimpleNamespace(dag_id=ti.dag_id)}


def kpo(
    k8s: KubernetesEmulatorServer, task_id: str, annotations: dict[str, str] | None = None, **kwargs: Any
) -> Any:
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    return KubernetesPodOperator(
        task_id=task_id,
        name=task_id,
        namespace="default",
        image="registry.example/train:1",
        cmds=["python", "train.py"],
        annotations={ANNOTATION + k: v for k, v in (annotations or {}).items()},
        config_file=k8s.kubeconfig_path,
        in_cluster=False,
        get_logs=True,
        startup_check_interval_seconds=1,
        poll_interval=0.2,
        **kwargs,
    )


def pod_name_of(k8s: KubernetesEmulatorServer, task_id: str) -> str:
    return next(
        b["metadata"]["name"] for b in k8s.created_pods() if b["metadata"]["name"].startswith(task_id)
    )


def final_state(k8s: KubernetesEmulatorServer, name: str) -> dict[str, Any]:
    history = k8s.pod_history(name)
    return next(v for v in reversed(history) if v["status"]["phase"] in {"Succeeded", "Failed"})


# -- KubernetesPodOperator, sync -----------------------------------------------------------------


def test_kpo_success_logs_read_as_text(
    k8s: KubernetesEmulatorServer, capsys: pytest.CaptureFixture[str]
) -> None:
    op = kpo(
        k8s,
        "train-ok",
        {"log-lines": json.dumps(["epoch 1 loss=0.9", "epoch 2 loss=0.4"])},
        container_resources=None,
        node_selector={"kubernetes.io/hostname": "gpu-h100-0"},
    )
    started = time.monotonic()
    op.execute(context_for("train-ok"))
    output = capsys.readouterr().out
    elapsed = time.monotonic() - started

    name = pod_name_of(k8s, "train-ok")
    sent = k8s.created_pods()[0]
    assert sent["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "gpu-h100-0"}
    assert sent["spec"]["containers"][0]["image"] == "registry.example/train:1"
    assert "[base] epoch 1 loss=0.9" in output and "[base] epoch 2 loss=0.4" in output
    assert "b'epoch" not in output  # text, not a bytes repr
    final = final_state(k8s, name)
    assert final["spec"]["nodeName"] == "gpu-h100-0"
    assert final["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    assert k8s.pod(name) is None  # KPO deleted it
    log_requests = [r for r in k8s.requests if r.path.endswith(f"/pods/{name}/log")]
    assert log_requests and log_requests[0].query.get("follow") == "True"
    assert elapsed < 10


def test_kpo_failing_pod_raises(k8s: KubernetesEmulatorServer) -> None:
    from airflow.sdk.exceptions import AirflowException

    op = kpo(k8s, "train-fails", {"exit-code": "1"})
    with pytest.raises(AirflowException):
        op.execute(context_for("train-fails"))
    final = final_state(k8s, pod_name_of(k8s, "train-fails"))
    terminated = final["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (final["status"]["phase"], terminated["exitCode"], terminated["reason"]) == ("Failed", 1, "Error")


def test_kpo_oom_killed_status_visible(k8s: KubernetesEmulatorServer) -> None:
    from airflow.sdk.exceptions import AirflowException

    op = kpo(k8s, "train-oom", on_finish_action="keep_pod")
    k8s.configure_pod(name="train-oom*", oom_killed=True)
    with pytest.raises(AirflowException):
        op.execute(context_for("train-oom"))
    pod = k8s.pod(pod_name_of(k8s, "train-oom"))
    assert pod is not None
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (pod["status"]["phase"], terminated["reason"], terminated["exitCode"]) == (
        "Failed",
        "OOMKilled",
        137,
    )


def test_kpo_never_scheduled_pod_times_out(k8s: KubernetesEmulatorServer) -> None:
    from airflow.providers.cncf.kubernetes.utils.pod_manager import PodLaunchTimeoutException
    from airflow.sdk.exceptions import AirflowException

    op = kpo(k8s, "train-stuck", {"never-schedule": "true"}, startup_timeout_seconds=3)
    started = time.monotonic()
    with pytest.raises(AirflowException) as failure:
        op.execute(context_for("train-stuck"))
    assert time.monotonic() - started < 10
    # KPO reports the launch timeout as the cause of its "returned a failure" error
    causes: list[type[BaseException]] = []
    error: BaseException | None = failure.value
    while error is not None:
        causes.append(type(error))
        error = error.__cause__ or error.__context__
    assert PodLaunchTimeoutException in causes
    name = pod_name_of(k8s, "train-stuck")
    reasons = [e["reason"] for e in k8s.events(involved_name=name)]
    assert "FailedScheduling" in reasons and "Scheduled" not in reasons


# -- KubernetesPodOperator, deferrable -------------------------------------------------------------


def test_kpo_deferrable_runs_trigger_against_emulator(
    k8s: KubernetesEmulatorServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    op = kpo(k8s, "train-deferred", {"log-lines": "deferred hello"}, deferrable=True)
    context = context_for("train-deferred")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    trigger = deferred.value.trigger

    async def first_event() -> Any:
        async for event in trigger.run():
            return event
        raise AssertionError("the trigger ended without an event")

    event = asyncio.run(asyncio.wait_for(first_event(), 30))
    assert event.payload["status"] == "success", event.payload
    getattr(op, deferred.value.method_name)(context, event.payload)
    assert "deferred hello" in capsys.readouterr().out
    assert final_state(k8s, pod_name_of(k8s, "train-deferred"))["status"]["phase"] == "Succeeded"


# -- checkpoints ---------------------------------------------------------------------------------


def test_checkpoints_manifest_last_and_resumed_numbering(
    k8s: KubernetesEmulatorServer, tmp_path: Path
) -> None:
    from airflow.sdk.exceptions import AirflowException

    ckpt = {"checkpoint-dir": tmp_path.as_uri(), "checkpoint-steps": "4", "fail-after-step": "2"}
    with pytest.raises(AirflowException):
        kpo(k8s, "train-ckpt-a", ckpt).execute(context_for("train-ckpt-a"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000001", "step-000002"]
    assert not (tmp_path / "COMPLETE").exists()
    for step_dir in tmp_path.iterdir():
        manifest, data = step_dir / "manifest.json", step_dir / "model.bin"
        assert manifest.stat().st_mtime_ns >= data.stat().st_mtime_ns
        assert json.loads(manifest.read_text())["step"] == int(step_dir.name.split("-")[1])

    resumed = kpo(k8s, "train-ckpt-b", ckpt, env_vars={"GPUPOOL_RESUME_FROM": str(tmp_path / "step-000002")})
    resumed.execute(context_for("train-ckpt-b"))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["COMPLETE", "step-000001", "step-000002", "step-000003", "step-000004"]
    manifest = json.loads((tmp_path / "step-000004" / "manifest.json").read_text())
    assert (
        manifest["step"] == 4
        and set(manifest) == {"step", "time", "metrics"}
        and "loss" in manifest["metrics"]
    )
    datetime.datetime.fromisoformat(manifest["time"])


# -- the kubernetes client: nodes, selectors, watches, lifecycle --------------------------------


def test_nodes_carry_gfd_labels_and_gpu_allocatable(core: Any) -> None:
    nodes = core.list_node(label_selector="nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3").items
    assert [n.metadata.name for n in nodes] == ["gpu-h100-0"]
    labels = nodes[0].metadata.labels
    assert labels["nvidia.com/gpu.memory"] == "81559" and labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/mig.strategy"] == "none" and labels["gpupool.io/pool"] == "h100"
    assert nodes[0].status.allocatable["nvidia.com/gpu"] == "8"
    mig = core.read_node("gpu-a100-1")
    assert mig.status.allocatable["nvidia.com/mig-1g.10gb"] == "7"
    assert mig.metadata.labels["nvidia.com/mig.strategy"] == "mixed"
    assert mig.spec.taints[0].key == "nvidia.com/gpu"


def simple_pod(
    name: str, *, labels: dict[str, str] | None = None, ann: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": labels or {},
            "annotations": {ANNOTATION + k: v for k, v in (ann or {}).items()},
        },
        "spec": {"restartPolicy": "Never", "containers": [{"name": "base", "image": "busybox"}]},
    }


def test_label_and_field_selectors(k8s: KubernetesEmulatorServer, core: Any) -> None:
    for name, team in (("sel-a", "vision"), ("sel-b", "nlp"), ("sel-c", "vision")):
        core.create_namespaced_pod(
            "default", simple_pod(name, labels={"team": team, "app": "train"}, ann={"duration-seconds": "30"})
        )
    names = lambda **kw: sorted(p.metadata.name for p in core.list_namespaced_pod("default", **kw).items)  # noqa: E731
    assert names(label_selector="team=vision") == ["sel-a", "sel-c"]
    assert names(label_selector="team!=vision,app=train") == ["sel-b"]
    assert names(label_selector="team in (nlp,speech)") == ["sel-b"]
    assert names(label_selector="missing") == []
    assert names(field_selector="metadata.name=sel-c") == ["sel-c"]
    created = core.read_namespaced_pod("sel-a", "default").metadata
    assert created.uid and created.creation_timestamp and int(created.resource_version) > 0
    k8s.wait_for_pod("sel-b", phases={"Running"}, timeout=10)  # its Scheduled event exists by then
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=sel-b").items
    assert events and {e.involved_object.name for e in events} == {"sel-b"}


def test_watch_true_streams_and_sees_deleted(k8s: KubernetesEmulatorServer, core: Any) -> None:
    from kubernetes import watch

    core.create_namespaced_pod("default", simple_pod("watched", labels={"w": "1"}))
    core.create_namespaced_pod("default", simple_pod("other", labels={"w": "2"}))
    seen: list[tuple[str, str]] = []
    w = watch.Watch()
    for event in w.stream(core.list_namespaced_pod, "default", label_selector="w=1", timeout_seconds=10):
        pod = event["object"]
        seen.append((event["type"], pod.status.phase))
        assert pod.metadata.name == "watched"
        if pod.status.phase == "Succeeded" and event["type"] == "MODIFIED":
            core.delete_namespaced_pod("watched", "default")
        if event["type"] == "DELETED":
            w.stop()
    assert seen[0] == ("ADDED", "Pending")
    assert ("MODIFIED", "Running") in seen and seen[-1][0] == "DELETED"
    assert any(r.query.get("watch") == "True" for r in k8s.requests)


def test_watch_timeout_seconds_is_honoured(core: Any) -> None:
    from kubernetes import watch

    started = time.monotonic()
    events = list(
        watch.Watch().stream(
            core.list_namespaced_pod, "default", label_selector="none=here", timeout_seconds=1
        )
    )
    assert events == [] and 0.9 < time.monotonic() - started < 5


def test_pending_pod_scheduled_when_gpus_free(k8s: KubernetesEmulatorServer, core: Any) -> None:
    def eight_gpus(name: str, duration: str) -> dict[str, Any]:
        pod = simple_pod(name, ann={"duration-seconds": duration})
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}}
        pod["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-h100-0"]}
                            ]
                        }
                    ]
                }
            }
        }
        return pod

    def refused() -> list[dict[str, Any]]:
        return [e for e in k8s.events(involved_name="big-2") if e["reason"] == "FailedScheduling"]

    # big-1 holds the node's 8 GPUs until told: big-2 is refused while it runs, whatever the load.
    core.create_namespaced_pod("default", eight_gpus("big-1", "60"))
    k8s.wait_for_pod("big-1", {"Running"})
    core.create_namespaced_pod("default", eight_gpus("big-2", "0.1"))
    deadline = time.monotonic() + 10
    while not refused() and time.monotonic() < deadline:
        time.sleep(0.05)
    failed = refused()
    assert failed and "Insufficient nvidia.com/gpu" in failed[0]["message"]
    assert k8s.pod("big-2")["status"]["phase"] == "Pending"  # type: ignore[index]
    k8s.finish_pod("big-1")
    k8s.wait_for_pod("big-2", {"Succeeded"})
    first, second = final_state(k8s, "big-1"), final_state(k8s, "big-2")
    assert second["spec"]["nodeName"] == "gpu-h100-0"
    assert second["status"]["startTime"] >= first["status"]["conditions"][0]["lastTransitionTime"]


@pytest.mark.parametrize(
    ("annotations", "reason"),
    [({"evict": "true"}, "Evicted"), ({"node-lost": "true"}, "NodeLost")],
    ids=["evicted", "node-lost"],
)
def test_interrupted_pods_fail_with_reason(
    k8s: KubernetesEmulatorServer, core: Any, annotations: dict[str, str], reason: str
) -> None:
    core.create_namespaced_pod("default", simple_pod("interrupted", ann=annotations))
    pod = k8s.wait_for_pod("interrupted")
    assert (pod["status"]["phase"], pod["status"]["reason"]) == ("Failed", reason)
    if reason == "NodeLost":
        node = k8s.node(pod["spec"]["nodeName"])
        assert node is not None and node["status"]["conditions"][0]["status"] == "Unknown"


def test_image_pull_error_waits_in_backoff(k8s: KubernetesEmulatorServer, core: Any) -> None:
    core.create_namespaced_pod("default", simple_pod("bad-image", ann={"image-pull-error": "true"}))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        statuses = core.read_namespaced_pod("bad-image", "default").status.container_statuses or []
        if statuses and statuses[0].state.waiting.reason == "ImagePullBackOff":
            break
        time.sleep(0.05)
    else:
        pytest.fail("the pod never reached ImagePullBackOff")
    assert core.read_namespaced_pod("bad-image", "default").status.phase == "Pending"


def test_follow_logs_stream_until_container_ends(k8s: KubernetesEmulatorServer, core: Any) -> None:
    core.create_namespaced_pod(
        "default",
        simple_pod(
            "follow", ann={"log-lines": "one\ntwo", "checkpoint-steps": "0", "duration-seconds": "0.5"}
        ),
    )
    k8s.wait_for_pod("follow", {"Running"})
    started = time.monotonic()
    response = core.read_namespaced_pod_log("follow", "default", follow=True, _preload_content=False)
    text = b"".join(response.stream()).decode()
    assert text.splitlines()[:2] == ["one", "two"]
    assert 0.1 < time.monotonic() - started < 5
    tail = core.read_namespaced_pod_log(
        "follow", "default", tail_lines=1, since_seconds=60, _preload_content=False
    )
    assert tail.data.decode() == "two\n"


def test_blocking_client_does_not_stall_server(k8s: KubernetesEmulatorServer, core: Any) -> None:
    core.create_namespaced_pod("default", simple_pod("slow-log", ann={"duration-seconds": "0.8"}))
    k8s.wait_for_pod("slow-log", {"Running"})
    follower = threading.Thread(
        target=lambda: (
            core.read_namespaced_pod_log("slow-log", "default", follow=True, _preload_content=False).data
        )
    )
    follower.start()
    assert core.list_node().items  # answered while a follow stream is open
    follower.join(timeout=5)
    assert not follower.is_alive()


def test_resource_claims_are_stored_and_go_with_the_pod_that_owns_them(
    k8s: KubernetesEmulatorServer, core: Any
) -> None:
    from kubernetes import client

    claims = client.CustomObjectsApi(core.api_client)
    where = ("resource.k8s.io", "v1", "default", "resourceclaims")
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
    for name in ("owned", "free"):
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": spec,
        }
        claims.create_namespaced_custom_object(*where, body)
    pod = core.create_namespaced_pod(
        "default",
        {"metadata": {"name": "claimer"}, "spec": {"containers": [{"name": "main", "image": "x"}]}},
    )
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "claimer", "uid": pod.metadata.uid}
    claims.patch_namespaced_custom_object(*where, "owned", {"metadata": {"ownerReferences": [owner]}})
    stored = claims.get_namespaced_custom_object(*where, "owned")
    assert stored["spec"] == spec and stored["metadata"]["ownerReferences"] == [owner]
    assert stored["metadata"]["uid"] and stored["metadata"]["resourceVersion"]

    core.delete_namespaced_pod("claimer", "default")
    k8s.wait_for_pod_gone("claimer")  # the DELETE answers while the pod terminates; its claims go after

    names = [c["metadata"]["name"] for c in claims.list_namespaced_custom_object(*where)["items"]]
    assert names == ["free"]  # the owned claim went with its pod; the unowned one stays


def test_kmock_forgets_served_requests_while_ours_keeps_them_and_reactions_still_apply(
    k8s: KubernetesEmulatorServer, core: Any
) -> None:
    # kmock walks its whole request log for every request: kept, 1,000 pods took minutes.
    from kubernetes.client.exceptions import ApiException

    k8s.clear_requests()
    for _ in range(20):
        core.list_namespaced_pod("default")
    assert k8s._run_sync(lambda api: len(api._requests)) == 0
    assert len(k8s.requests) == 20

    def react(api: Any) -> None:
        api["get /api/v1/namespaces/default/pods/broken"] << 503 << {"kind": "Status", "code": 503}

    core.create_namespaced_pod(
        "default", {"metadata": {"name": "broken"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    )
    k8s._run_sync(react)
    for _ in range(2):  # a reaction answers every time, not only while the log holds its request
        with pytest.raises(ApiException) as raised:
            core.read_namespaced_pod("broken", "default")
        assert raised.value.status == 503
