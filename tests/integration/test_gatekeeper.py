"""The gatekeeper against the emulator over HTTP, on SQLite and PostgreSQL ledgers.

Pods gated by the executor hook wait in the ledger's queue while the pool is full, are pinned and
ungated when granted (patches the emulator checks as a real API server would), their grant is
released when they end; refused or timed-out pods get an Event naming why and are deleted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_gpupool.controller.gatekeeper import (
    REASON_ADMITTED,
    REASON_REFUSED,
    REASON_TIMED_OUT,
    gated_reservation_id,
    gatekeep,
)
from airflow_gpupool.controller.reconcile import reconcile
from airflow_gpupool.labels import RESERVATION_LABEL, SCHEDULING_GATE
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.integration.gatekeeper_fixtures import create_hooked_pod, messages, reasons
from tests.ledger_fixtures import FakeClock

H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    nodes = [
        gpu_node(
            "gpu-h100-0", gpus=2, product=H100, memory_mib=81559, taints=["nvidia.com/gpu=present:NoSchedule"]
        )
    ]
    with KubernetesEmulatorServer(nodes=nodes, default_duration_seconds=0.2) as server:
        yield server


def test_waits_while_full_then_runs_pinned_and_is_released(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    blocker = synced.reserve(GpuRequest(gpus=2), "someone-else", reservation_id="gp-blocker")
    assert blocker.state is ReservationState.GRANTED
    created = create_hooked_pod(core, "legacy-1", {"nvidia.com/gpu": "1"})
    rid = gated_reservation_id(created["metadata"]["uid"])

    first = gatekeep(synced, core)
    assert first.waiting == ["default/legacy-1"]
    waiting = synced.get(rid)
    assert waiting.state is ReservationState.WAITING
    assert waiting.holder == "legacy/legacy-1/manual__1/map--1/try-1@gatekeeper"
    time.sleep(0.3)
    pod = k8s.pod("legacy-1")
    assert pod is not None and pod["status"]["phase"] == "Pending"
    assert pod["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]

    synced.release("gp-blocker")
    second = gatekeep(synced, core)
    assert second.admitted == ["default/legacy-1"]
    granted = synced.get(rid)
    assert granted.state is ReservationState.GRANTED
    assert granted.grant is not None
    assert (granted.grant.pod_name, granted.grant.pod_uid) == ("legacy-1", created["metadata"]["uid"])
    done = k8s.wait_for_pod("legacy-1", timeout=10)
    assert done["status"]["phase"] == "Succeeded"
    assert done["spec"]["nodeName"] == "gpu-h100-0"
    assert done["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "gpu-h100-0"}
    assert not done["spec"].get("schedulingGates")
    assert done["metadata"]["labels"][RESERVATION_LABEL] == rid
    assert REASON_ADMITTED in reasons(k8s, "legacy-1")

    third = gatekeep(synced, core)
    assert third.released == [rid]
    assert synced.get(rid).state is ReservationState.RELEASED


def test_reconcile_frees_the_grant_of_a_finished_admitted_pod(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    created = create_hooked_pod(core, "legacy-2", {"nvidia.com/gpu": "2"})
    rid = gated_reservation_id(created["metadata"]["uid"])
    assert gatekeep(synced, core).admitted == ["default/legacy-2"]
    k8s.wait_for_pod("legacy-2", timeout=10)
    result = reconcile(synced, core)
    assert [r for r, _ in result.released] == [rid]


def test_refused_binding_gets_an_event_and_the_pod_is_deleted(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    create_hooked_pod(core, "frac", {}, **{"gpupool.io/request": '{"gpu_milli": 500}'})
    result = gatekeep(synced, core)
    assert [pod for pod, _ in result.deleted] == ["default/frac"]
    assert k8s.pod("frac") is None
    (message,) = messages(k8s, "frac", REASON_REFUSED)
    assert "gpu_milli" in message and "cannot be added to a pod after it is created" in message
    assert synced.snapshot().queue == ()


def test_timed_out_reservation_names_what_blocked_it_and_deletes_the_pod(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, clock: FakeClock
) -> None:
    synced.reserve(GpuRequest(gpus=2), "someone-else", reservation_id="gp-blocker", ttl=3600)
    create_hooked_pod(core, "late", {"nvidia.com/gpu": "1"})
    assert gatekeep(synced, core, timeout=5).waiting == ["default/late"]
    clock.advance(10)
    synced.reap()
    result = gatekeep(synced, core, timeout=5)
    assert [pod for pod, _ in result.deleted] == ["default/late"]
    (message,) = messages(k8s, "late", REASON_TIMED_OUT)
    assert "timed_out" in message and "blocked by" in message
    assert k8s.pod("late") is None


def test_a_waiting_request_is_withdrawn_when_its_pod_goes(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    synced.reserve(GpuRequest(gpus=2), "someone-else", reservation_id="gp-blocker")
    created = create_hooked_pod(core, "gone", {"nvidia.com/gpu": "1"})
    gatekeep(synced, core)
    core.delete_namespaced_pod("gone", "default")
    result = gatekeep(synced, core)
    rid = gated_reservation_id(created["metadata"]["uid"])
    assert result.withdrawn == [rid]
    assert synced.get(rid).state.ended


def test_pods_without_gpus_or_from_gpu_pod_operator_are_not_touched(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    create_hooked_pod(core, "cpu", {"cpu": "1"})
    create_hooked_pod(core, "ours", {"nvidia.com/gpu": "1"}, **{"gpupool.io/reservation-id": "gp-op"})
    result = gatekeep(synced, core)
    assert (result.admitted, result.waiting, result.deleted) == ([], [], [])
    assert synced.snapshot().queue == () and synced.snapshot().grants == ()


def test_a_gang_jobs_gated_pods_are_left_to_their_operator(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    pod = gang_member_pod("gang-0")
    core.create_namespaced_pod("default", pod)
    result = gatekeep(synced, core)
    assert (result.admitted, result.waiting, result.deleted) == ([], [], [])
    assert k8s.pod("gang-0") is not None and synced.snapshot().queue == ()


def gang_member_pod(name: str) -> dict[str, Any]:
    """A pod as GpuJobOperator's Job creates it: gated, annotated with its gang, no request annotation."""
    return {
        "metadata": {"name": name, "annotations": {"gpupool.io/gang-reservation": "gp-leader"}},
        "spec": {
            "schedulingGates": [{"name": SCHEDULING_GATE}],
            "containers": [
                {"name": "base", "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ],
        },
    }


def test_a_running_admitted_pod_keeps_its_grant_until_it_is_gone(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    created = create_hooked_pod(
        core,
        "long",
        {"nvidia.com/gpu": "1"},
        **{"gpupool.emulator/duration-seconds": "120", "gpupool.emulator/sigterm-exit-seconds": "1"},
    )
    rid = gated_reservation_id(created["metadata"]["uid"])
    assert gatekeep(synced, core).admitted == ["default/long"]
    k8s.wait_for_pod("long", phases={"Running"})
    for _ in range(2):
        again = gatekeep(synced, core)
        assert (again.released, again.deleted) == ([], [])
        assert synced.get(rid).state is ReservationState.GRANTED
    core.delete_namespaced_pod("long", "default")
    # Terminating (1 s to exit on SIGTERM), it still runs on its GPU: the grant is kept.
    assert gatekeep(synced, core).released == []
    k8s.wait_for_pod_gone("long")
    assert gatekeep(synced, core).released == [rid]
    assert synced.get(rid).message == "gatekeeper: pod default/long gone"


def test_an_unreachable_ledger_fails_the_pass_and_deletes_nothing(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_gpupool.exceptions import LedgerUnavailableError

    create_hooked_pod(core, "patient", {"nvidia.com/gpu": "1"})

    def down(*args: Any, **kwargs: Any) -> Any:
        raise LedgerUnavailableError(60.0, "connection refused")

    monkeypatch.setattr(synced, "reserve", down)
    with pytest.raises(LedgerUnavailableError):
        gatekeep(synced, core)
    assert k8s.pod("patient") is not None


@pytest.fixture
def ledger_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each ledger write: a serialized write transaction or a concurrent-path attempt."""
    from airflow_gpupool.ledger.postgres.concurrent import ConcurrentPath
    from airflow_gpupool.ledger.store import transactions as store_module

    writes: list[str] = []
    real_write, real_connect = store_module.write_transaction, ConcurrentPath.connect

    def write_transaction(*args: Any, **kwargs: Any) -> Any:
        writes.append("write transaction")
        return real_write(*args, **kwargs)

    def connect(self: ConcurrentPath) -> Any:
        writes.append("concurrent path")
        return real_connect(self)

    monkeypatch.setattr(store_module, "write_transaction", write_transaction)
    monkeypatch.setattr(ConcurrentPath, "connect", connect)
    return writes


def test_a_batch_is_admitted_by_priority_with_one_write_per_new_pod_and_one_bind(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, ledger_writes: list[str]
) -> None:
    # Created lowest priority first: list order alone would admit "p0" and "p5".
    for name, priority in (("p0", 0), ("p5", 5), ("p1", 1), ("p9", 9)):
        create_hooked_pod(core, name, {"nvidia.com/gpu": "1"}, **{"gpupool.io/priority": str(priority)})
    ledger_writes.clear()

    first = gatekeep(synced, core)

    assert first.admitted == ["default/p9", "default/p5"]  # two GPUs: the two highest priorities
    assert first.waiting == ["default/p1", "default/p0"]
    # One reserve per new pod and one bind for both admitted pods; on PostgreSQL a reserve may
    # first try the concurrent path (one attempt), and a grant there needs no serialized write.
    if synced.dialect == "sqlite":
        assert ledger_writes == ["write transaction"] * (4 + 1)
    else:
        assert ledger_writes.count("concurrent path") <= 4
        assert ledger_writes.count("write transaction") <= 4 + 1
    bound = {r.grant.pod_name for r in synced.snapshot().grants if r.grant is not None}
    assert bound == {"p9", "p5"}

    ledger_writes.clear()
    second = gatekeep(synced, core)
    assert (second.admitted, second.waiting) == ([], ["default/p1", "default/p0"])
    assert ledger_writes == []  # queued pods are not reserved again
