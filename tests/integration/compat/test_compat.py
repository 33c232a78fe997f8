"""Drop-in compatibility: GpuPodOperator ends every scenario exactly as KubernetesPodOperator does.

Each scenario of :data:`~tests.integration.compat.scenarios.SCENARIOS` runs twice against the
Kubernetes emulator, over HTTP through the real operator code: once through plain
``KubernetesPodOperator``, once through ``GpuPodOperator`` (one whole GPU from a real SQLite
ledger). The operators are driven as Airflow's task runner drives them (render the templates,
``execute``; when deferred, the trigger runs to its event and the resume method is called), and
the final state follows Airflow's rule: ``AirflowSkipException`` is skipped,
``AirflowFailException`` failed, any other error up for retry while retries remain.

Compared: final state, exception type and message, XComs, the callbacks made, the return
value, whether the pod was deleted, and the pod as sent. The only differences allowed are the
pinning: node affinity, GPU resources, ``gpupool.io/*`` labels and annotations, ``GPUPOOL_*`` /
``NVIDIA_*`` env, the priority class and GPU toleration, ``gpupool_*`` XComs, and what the
project adds to an exception (its notes and ``gpupool_failure`` attribute). A failure's
``remote_pod:`` dump (uids, timestamps, the pinned spec) is compared as present or absent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_gpupool.ledger import Ledger
from airflow_gpupool.testing import KubernetesEmulatorServer
from tests.integration.compat import callbacks
from tests.integration.compat.driver import FakeTaskInstance, drive
from tests.integration.compat.scenarios import SCENARIOS, Scenario

ANNOTATION = "gpupool.emulator/"
# An ApiException's message quotes the response headers, the server's Date among them.
_DATE_HEADER = re.compile(r"'Date': '[^']*'")
PINNING_ENV = ("GPUPOOL_", "NVIDIA_")
PINNING_PREFIX = "gpupool.io/"
#: The exception the last run raised (None: it succeeded), for tests that look beyond the Outcome.
LAST_ERROR: list[Any] = [None]


@dataclass(frozen=True)
class Outcome:
    """How one run ended, normalised for comparison."""

    state: str
    error_type: str | None
    message: str | None
    pod_dump: bool
    xcoms: dict[str, Any]
    result: Any
    callbacks: tuple[str, ...]
    pod_deleted: bool
    pod: dict[str, Any]


def pod_template(tmp_path: Path) -> str:
    path = tmp_path / "pod-template.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  labels: {from-template: 'yes'}\n"
        "spec:\n  containers:\n    - name: base\n      image: registry.example/train:3\n"
    )
    return str(path)


def build(scenario: Scenario, gpu: bool, tmp_path: Path, k8s: KubernetesEmulatorServer) -> Any:
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from kubernetes.client import ApiClient

    from airflow_gpupool.operators import GpuPodOperator

    kwargs: dict[str, Any] = {
        "task_id": scenario.name,
        "name": scenario.name,
        "random_name_suffix": False,
        "namespace": "default",
        "image": "registry.example/train:1",
        "cmds": ["python", "train.py"],
        "annotations": {ANNOTATION + k: v for k, v in scenario.behaviour.items()},
        "config_file": k8s.kubeconfig_path,
        "in_cluster": False,
        "get_logs": True,
        # Both operators poll the pod's start this often: the emulator starts pods in milliseconds.
        "startup_check_interval_seconds": 0.2,
        "poll_interval": 0.2,
        "deferrable": scenario.deferrable,
        "retries": scenario.retries,
        "params": {"cpu": "1500m", "memory": "3Gi"},
        **scenario.kwargs,
    }
    if kwargs.get("callbacks") == "RECORDING":
        kwargs["callbacks"] = callbacks.RecordingCallback
    if kwargs.get("pod_template_file") == "TEMPLATE":
        kwargs["pod_template_file"] = pod_template(tmp_path)
    if scenario.pod_spec is not None:
        spec = json.loads(json.dumps(scenario.pod_spec))
        spec["metadata"].setdefault("annotations", {}).update(kwargs.pop("annotations"))
        kwargs["full_pod_spec"] = ApiClient()._ApiClient__deserialize(spec, "V1Pod")
    if gpu:
        return GpuPodOperator(gpus=1, **kwargs)
    return KubernetesPodOperator(**kwargs)


def inject_faults(k8s: KubernetesEmulatorServer, scenario: Scenario) -> None:
    """Make the API server answer this scenario's pod requests with an error (kmock reactions)."""
    for method, sub, status in scenario.faults:
        path = f"/api/v1/namespaces/default/pods/{scenario.name}" + (f"/{sub}" if sub else "")
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": status,
            "message": "injected",
        }

        def react(
            api: Any, method: str = method, path: str = path, status: int = status, body: Any = body
        ) -> None:
            api[f"{method} {path}"] << status << body

        k8s._run_sync(react)


def _pod_shape(body: dict[str, Any]) -> dict[str, Any]:
    """The pod as sent, without the pinning (kept: what KPO set, which GpuPodOperator must keep)."""
    meta, spec = body.get("metadata") or {}, body.get("spec") or {}

    def strip(d: dict[str, Any] | None) -> dict[str, Any]:
        return {k: v for k, v in (d or {}).items() if not k.startswith(PINNING_PREFIX)}

    containers = []
    for c in spec.get("containers") or []:
        env = [e for e in c.get("env") or [] if not e["name"].startswith(PINNING_ENV)]
        resources = {
            kind: {k: v for k, v in (values or {}).items() if not k.startswith("nvidia.com/")}
            for kind, values in (c.get("resources") or {}).items()
        }
        shape = {k: c.get(k) for k in ("name", "image", "command", "args", "ports", "volumeMounts")}
        containers.append({**shape, "env": env, "resources": {k: v for k, v in resources.items() if v}})
    # The CPU and memory the ledger accounts for are part of the slice: GpuPodOperator may add them
    # where the task set none, never change one it set (checked by resources_kept).
    return {
        "name": meta.get("name"),
        "labels": strip(meta.get("labels")),
        "annotations": strip(meta.get("annotations")),
        "containers": containers,
        "restartPolicy": spec.get("restartPolicy"),
        "terminationGracePeriodSeconds": spec.get("terminationGracePeriodSeconds"),
        "volumes": spec.get("volumes"),
        "tolerations": [t for t in spec.get("tolerations") or [] if t.get("key") != "nvidia.com/gpu"],
    }


def run_once(scenario: Scenario, gpu: bool, tmp_path: Path, k8s: KubernetesEmulatorServer) -> Outcome:
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    k8s.reset()
    inject_faults(k8s, scenario)
    callbacks.CALLS.clear()
    op = build(scenario, gpu, tmp_path, k8s)
    ti = FakeTaskInstance(scenario.name, scenario.retries)
    context: dict[str, Any] = {
        "ti": ti,
        "task_instance": ti,
        "run_id": ti.run_id,
        "params": op.params,
        "dag": DAG(ti.dag_id, schedule=None),
    }
    op.render_template_fields(context)
    result, error = None, None
    try:
        result = drive(op, context)
    except Exception as e:
        error = e
    LAST_ERROR[:] = [error]
    if error is None:
        state = "success"
    elif isinstance(error, AirflowSkipException):
        state = "skipped"
    elif isinstance(error, AirflowFailException) or ti.try_number > ti.max_tries:
        state = "failed"
    else:
        state = "up_for_retry"
    message = None if error is None else _DATE_HEADER.sub("'Date': <date>", str(error))
    dump = message is not None and "\nremote_pod: " in message
    if dump:
        message = message.split("\nremote_pod: ")[0]
    created = k8s.created_pods()
    return Outcome(
        state=state,
        error_type=None if error is None else f"{type(error).__module__}.{type(error).__qualname__}",
        message=message,
        pod_dump=dump,
        xcoms={k: v for k, v in ti.xcoms.items() if not k.startswith("gpupool_")},
        result=result,
        callbacks=tuple(callbacks.CALLS),
        pod_deleted=k8s.pod(scenario.name) is None,
        pod=_pod_shape(created[-1]) if created else {},
    )


@pytest.fixture
def compat_ledger(gpu_ledger: Ledger) -> Iterator[Ledger]:
    yield gpu_ledger
    snapshot = gpu_ledger.snapshot()
    assert snapshot.grants == () and snapshot.queue == (), "every slice goes back"


def test_the_table_covers_every_kpo_path() -> None:
    names = [s.name for s in SCENARIOS]
    assert len(names) == len(set(names)) >= 40
    states = {s.state for s in SCENARIOS}
    assert states == {"success", "skipped", "failed", "up_for_retry"}
    assert sum(s.deferrable for s in SCENARIOS) >= 15


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_gpu_pod_operator_ends_as_kubernetes_pod_operator(
    scenario: Scenario, k8s: KubernetesEmulatorServer, compat_ledger: Ledger, tmp_path: Path
) -> None:
    kpo = run_once(scenario, gpu=False, tmp_path=tmp_path, k8s=k8s)
    gpo = run_once(scenario, gpu=True, tmp_path=tmp_path, k8s=k8s)

    assert kpo.state == scenario.state, f"the scenario does not do what it says: {kpo}"
    assert asdict(replace(gpo, pod={})) == asdict(replace(kpo, pod={}))
    assert without_resources(gpo.pod) == without_resources(kpo.pod)
    resources_kept(kpo.pod, gpo.pod)


def without_resources(pod: dict[str, Any]) -> dict[str, Any]:
    return {**pod, "containers": [{**c, "resources": None} for c in pod.get("containers", [])]}


def resources_kept(kpo: dict[str, Any], gpo: dict[str, Any]) -> None:
    """Every resource KPO set is in GpuPodOperator's pod, unchanged; it adds only CPU and memory."""
    for theirs, ours in zip(kpo["containers"], gpo["containers"], strict=True):
        for kind in ("requests", "limits"):
            set_by_kpo, set_by_us = theirs["resources"].get(kind, {}), ours["resources"].get(kind, {})
            assert {k: set_by_us.get(k) for k in set_by_kpo} == set_by_kpo, (kind, theirs, ours)
            assert set(set_by_us) - set(set_by_kpo) <= {"cpu", "memory"}, (kind, theirs, ours)


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "def"])
def test_the_ladders_fail_fast_keeps_kpos_message(
    deferrable: bool, k8s: KubernetesEmulatorServer, compat_ledger: Ledger, tmp_path: Path
) -> None:
    """An image pull error with retries left: KPO is retried, the ladder fails fast (its decision).

    The one difference the ladder may make: ``AirflowFailException`` instead of a retry, with
    KPO's message, KPO's exception as its cause, and the class in its note.
    """
    from airflow_gpupool.operators.failures import report_of

    scenario = Scenario(
        f"ladder-image-pull-{'def' if deferrable else 'sync'}",
        "up_for_retry",
        behaviour={"image-pull-error": "true"},
        kwargs={"startup_timeout_seconds": 3},
        deferrable=deferrable,
        retries=2,
    )
    kpo = run_once(scenario, gpu=False, tmp_path=tmp_path, k8s=k8s)
    gpo = run_once(scenario, gpu=True, tmp_path=tmp_path, k8s=k8s)
    assert kpo.state == "up_for_retry" and gpo.state == "failed"
    assert gpo.error_type == "airflow.sdk.exceptions.AirflowFailException"
    assert (gpo.message, gpo.pod_dump, gpo.xcoms, gpo.pod_deleted) == (
        kpo.message,
        kpo.pod_dump,
        kpo.xcoms,
        kpo.pod_deleted,
    )
    assert report_of(LAST_ERROR[0]) is not None and "image_pull" in LAST_ERROR[0].__notes__[0]
    assert f"{type(LAST_ERROR[0].__cause__).__module__}.{type(LAST_ERROR[0].__cause__).__qualname__}" == (
        kpo.error_type
    )
