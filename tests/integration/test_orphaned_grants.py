"""Bound and orphaned grants against the Kubernetes emulator over HTTP, on SQLite and PostgreSQL.

A grant whose pod was created is bound; when its lease expires while the pod still runs (its
worker died), the slice stays held until reconcile sees the pod finished or gone, or deletes it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_gpupool.controller.reconcile import ORPHAN_EVENT_REASON, reconcile, reconcile_grant
from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.labels import RESERVATION_LABEL
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from airflow_gpupool.testing.pods.pod_history import gpu_overlaps
from tests.ledger_fixtures import FakeClock

H100 = "NVIDIA-H100-80GB-HBM3"
EIGHT = GpuRequest(gpus=8)


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    nodes = [gpu_node("gpu-h100-0", gpus=8, product=H100, memory_mib=81559)]
    with KubernetesEmulatorServer(nodes=nodes, default_duration_seconds=0.1) as server:
        yield server


def running_pod(
    k8s: KubernetesEmulatorServer,
    core: Any,
    name: str,
    reservation_id: str,
    *,
    gpus: tuple[int, ...] = (),
    node: str | None = None,
    termination_grace: int | None = None,
    **annotations: str,
) -> str:
    """Create a pod labelled with ``reservation_id`` that runs for two minutes; return its uid.

    :param gpus: the GPU indices it is pinned to (the pod history's ``GPUPOOL_GPU_INDICES``)
    :param node: place it on this node by name
    :param termination_grace: its ``terminationGracePeriodSeconds`` (None: Kubernetes' 30)
    :param annotations: more ``gpupool.emulator/`` annotations (``sigterm_exit_seconds="3"``)
    """
    emulated = {"duration-seconds": "120"} | {k.replace("_", "-"): v for k, v in annotations.items()}
    container: dict[str, Any] = {"name": "main", "image": "train:1"}
    if gpus:
        container["env"] = [{"name": "GPUPOOL_GPU_INDICES", "value": ",".join(map(str, gpus))}]
    core.create_namespaced_pod(
        "default",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {RESERVATION_LABEL: reservation_id},
                "annotations": {f"gpupool.emulator/{k}": v for k, v in emulated.items()},
            },
            "spec": {
                "restartPolicy": "Never",
                "containers": [container],
                **({"nodeName": node} if node else {}),
                **({"terminationGracePeriodSeconds": termination_grace} if termination_grace else {}),
            },
        },
    )
    k8s.wait_for_pod(name, phases={"Running"})
    pod = k8s.pod(name)
    assert pod is not None
    return str(pod["metadata"]["uid"])


def bound_and_orphaned(
    ledger: Ledger, k8s: KubernetesEmulatorServer, core: Any, clock: FakeClock, rid: str, pod: str
) -> str:
    """Reserve 8 GPUs with ttl=4 as ``rid``, bind them to a running pod, let the lease expire."""
    assert ledger.reserve(EIGHT, "worker-1", ttl=4, reservation_id=rid).state is ReservationState.GRANTED
    uid = running_pod(k8s, core, pod, rid)
    ledger.bind(rid, namespace="default", name=pod, uid=uid)
    clock.advance(6)
    assert ledger.reap().orphaned == (rid,)
    return uid


def test_an_orphan_keeps_its_gpus_until_its_pod_ends_then_the_queue_gets_them(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, clock: FakeClock
) -> None:
    ledger = synced
    uid = bound_and_orphaned(ledger, k8s, core, clock, "gp-first", "first")
    orphan = ledger.get("gp-first")
    assert orphan.state is ReservationState.ORPHANED and orphan.orphaned_at == clock()
    assert orphan.grant is not None and (orphan.grant.pod_name, orphan.grant.pod_uid) == ("first", uid)

    second = ledger.reserve(EIGHT, "worker-2", reservation_id="gp-second")
    assert second.state is ReservationState.WAITING  # not granted on the orphan's GPUs
    snapshot = ledger.snapshot()
    assert [r.id for r in snapshot.grants] == ["gp-first"]
    assert snapshot.to_dict()["orphaned"] == ["gp-first"]
    assert snapshot.gpu_allocated_milli == 8000
    assert ledger.check_invariants(core) == []

    kept = reconcile(ledger, core)
    assert kept.orphans_kept == ("gp-first",) and kept.released == () and kept.deleted == ()
    assert ledger.get("gp-second").state is ReservationState.WAITING

    k8s.interrupt_pod("first")
    k8s.wait_for_pod("first")
    freed = reconcile(ledger, core)

    assert freed.released == (
        ("gp-first", "pod default/first finished (Failed: evicted (Evicted, exit code 137))"),
    )
    assert freed.orphans_released == ("gp-first",)
    assert ledger.get("gp-first").state is ReservationState.RELEASED
    granted = ledger.get("gp-second")
    assert granted.state is ReservationState.GRANTED and granted.grant is not None
    assert granted.grant.node == "gpu-h100-0"
    assert ledger.check_invariants(core) == []


def test_an_unbound_grant_still_frees_at_expiry_and_the_cluster_check_sees_the_double_use(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, clock: FakeClock
) -> None:
    ledger = synced
    ledger.reserve(EIGHT, "worker-1", ttl=4, reservation_id="gp-unbound")
    running_pod(k8s, core, "unbound", "gp-unbound")  # created, but never bound
    clock.advance(6)

    reaped = ledger.reap()

    assert reaped.expired == ("gp-unbound",) and reaped.orphaned == ()
    again = ledger.reserve(EIGHT, "worker-2", reservation_id="gp-again")
    assert again.state is ReservationState.GRANTED
    running_pod(k8s, core, "again", "gp-again")
    assert ledger.check_invariants() == []  # the ledger alone sees nothing wrong
    violations = ledger.check_invariants(core)
    assert len(violations) == 8
    assert (
        violations[0] == "gpu gpu-h100-0/0: used by 2 live pods at once ['default/again', 'default/unbound']"
    )


def test_an_orphan_whose_pod_runs_past_the_grace_has_its_pod_deleted_with_an_event(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, clock: FakeClock
) -> None:
    ledger = synced
    uid = bound_and_orphaned(ledger, k8s, core, clock, "gp-stuck", "stuck")
    assert reconcile(ledger, core, orphan_grace_seconds=30).orphans_kept == ("gp-stuck",)
    assert not [r for r in k8s.requests if r.method == "DELETE"]
    clock.advance(31)
    k8s.clear_requests()

    result = reconcile(ledger, core, orphan_grace_seconds=30)

    assert result.deleted == (("gp-stuck", "default/stuck"),)
    assert result.orphans_released == ("gp-stuck",)
    deletes = [r.path for r in k8s.requests if r.method == "DELETE"]
    assert deletes == ["/api/v1/namespaces/default/pods/stuck"]
    (event,) = [e for e in k8s.events("default", involved_name="stuck") if e["reason"] == ORPHAN_EVENT_REASON]
    assert event["involvedObject"]["uid"] == uid and event["type"] == "Warning"
    assert "gp-stuck" in event["message"] and "30s" in event["message"]
    released = ledger.get("gp-stuck")
    assert released.state is ReservationState.RELEASED
    assert released.message == "reconcile: orphaned for over 30s: deleted pod default/stuck"
    assert ledger.snapshot().grants == () and ledger.check_invariants(core) == []


def test_a_pass_deletes_several_orphans_pods_together_and_waits_about_one_grace_not_their_sum(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, clock: FakeClock
) -> None:
    ledger = synced
    names = ("orphan-a", "orphan-b", "orphan-c")
    for name in names:
        rid = f"gp-{name}"
        granted = ledger.reserve(GpuRequest(gpus=2), "worker-1", ttl=4, reservation_id=rid)
        assert granted.state is ReservationState.GRANTED and granted.grant is not None
        # A 20 s grace, of which its containers take 8 s to exit after SIGTERM.
        gpus = granted.grant.gpu_indices
        uid = running_pod(k8s, core, name, rid, gpus=gpus, termination_grace=20, sigterm_exit_seconds="8")
        ledger.bind(rid, namespace="default", name=name, uid=uid)
    clock.advance(6)
    assert len(ledger.reap().orphaned) == 3
    clock.advance(31)

    started = time.monotonic()
    result = reconcile(ledger, core, orphan_grace_seconds=30)
    took = time.monotonic() - started

    assert sorted(result.orphans_released) == [f"gp-{n}" for n in names]
    deletes = [r for r in k8s.requests if r.method == "DELETE"]
    assert len(deletes) == 3 and deletes[-1].time - deletes[0].time < 4, "all deleted before any wait"
    # Released only once the pods were gone (8 s each, at once), not one after another (24 s).
    assert 8 <= took < 16, took
    assert all(k8s.pod(name) is None for name in names)
    assert all(ledger.get(f"gp-{n}").state is ReservationState.RELEASED for n in names)
    assert gpu_overlaps(k8s.pod_records()) == []
    assert ledger.snapshot().grants == () and ledger.check_invariants(core) == []


def test_a_preemption_victim_whose_pod_outlives_its_grace_is_deleted_at_once_and_the_preemptor_runs(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, clock: FakeClock, make_ledger: Any
) -> None:
    ledger = make_ledger(min_runtime_seconds=0, preemption_grace_seconds=30)
    victim = GpuRequest(gpus=8, preemptible=True)
    granted = ledger.reserve(victim, "worker-1", ttl=600, reservation_id="gp-victim")
    assert granted.state is ReservationState.GRANTED and granted.grant is not None
    gpus, node = granted.grant.gpu_indices, granted.grant.node
    # On SIGTERM its containers would take 3 s to exit: a graceful delete leaves it on its GPUs.
    uid = running_pod(k8s, core, "victim", "gp-victim", gpus=gpus, sigterm_exit_seconds="3")
    ledger.bind("gp-victim", namespace="default", name="victim", uid=uid)
    urgent = GpuRequest(gpus=8, priority=100)
    assert ledger.reserve(urgent, "worker-2", reservation_id="gp-urgent").state is ReservationState.WAITING
    assert ledger.get("gp-victim").state is ReservationState.PREEMPTING
    clock.advance(31)  # its holder never acted on the notice (the pod runs two minutes)
    assert ledger.reap().orphaned == ("gp-victim",)
    k8s.clear_requests()

    # The default orphan grace (600 s) does not apply: the victim had its grace.
    result = reconcile(ledger, core)

    assert result.deleted == (("gp-victim", "default/victim"),)
    (delete,) = [r for r in k8s.requests if r.method == "DELETE"]
    assert delete.path == "/api/v1/namespaces/default/pods/victim"
    assert delete.query.get("gracePeriodSeconds") == "0"  # its grace is spent: no more SIGTERM time
    (event,) = [
        e for e in k8s.events("default", involved_name="victim") if e["reason"] == ORPHAN_EVENT_REASON
    ]
    assert "preempted for gp-urgent" in event["message"]
    ended = ledger.get("gp-victim")
    assert ended.state is ReservationState.PREEMPTED
    assert ended.message.startswith("reconcile: preemption grace ended: deleted pod default/victim")
    urgent_grant = ledger.get("gp-urgent")
    assert urgent_grant.state is ReservationState.GRANTED and urgent_grant.grant is not None
    assert ledger.check_invariants(core) == []
    # The preemptor's pod starts at once on the GPUs it was granted: from the cluster's pod
    # history, it never shares one with the victim's.
    assert urgent_grant.grant.gpu_indices == gpus
    running_pod(k8s, core, "urgent", "gp-urgent", gpus=gpus, node=node, duration_seconds="0.5")
    k8s.wait_for_pod("urgent")
    assert gpu_overlaps(k8s.pod_records()) == []


def test_an_orphan_whose_pod_is_gone_is_released_at_once(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, clock: FakeClock
) -> None:
    ledger = synced
    bound_and_orphaned(ledger, k8s, core, clock, "gp-gone", "gone")
    core.delete_namespaced_pod("gone", "default")
    k8s.wait_for_pod_gone("gone")  # the DELETE answers while the pod terminates

    result = reconcile(ledger, core)

    assert result.released == (("gp-gone", "pod default/gone gone"),)
    assert ledger.get("gp-gone").state is ReservationState.RELEASED


def test_a_returning_holder_renews_its_orphan_and_reconcile_grant_releases_a_gone_pod(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, clock: FakeClock
) -> None:
    ledger = synced
    bound_and_orphaned(ledger, k8s, core, clock, "gp-back", "back")

    renewed = ledger.renew("gp-back", ttl=60)

    assert renewed.state is ReservationState.GRANTED and renewed.orphaned_at is None
    assert renewed.grant is not None and renewed.grant.expires_at == clock() + 60
    assert reconcile_grant(ledger, core, "gp-back") is None  # its pod runs
    k8s.interrupt_pod("back")
    k8s.wait_for_pod("back")
    assert (
        reconcile_grant(ledger, core, "gp-back")
        == "pod default/back finished (Failed: evicted (Evicted, exit code 137))"
    )


def test_reconcile_leaves_manual_grants_alone_unless_asked(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    ledger = synced
    ledger.reserve(GpuRequest(gpus=1), "by-hand", reservation_id="manual-1")
    ledger.reserve(GpuRequest(gpus=1), "operator", reservation_id="gp-op-1")

    result = reconcile(ledger, core, grace_seconds=0)

    assert result.released == (("gp-op-1", "no pod for 0s"),) and result.kept == ()
    assert ledger.get("manual-1").state is ReservationState.GRANTED
    widened = reconcile(ledger, core, grace_seconds=0, include_manual=True)
    assert widened.released == (("manual-1", "no pod for 0s"),)


@pytest.mark.parametrize("grace", [-100.0, math.nan, "5"])
def test_reconcile_refuses_a_bad_grace(synced: Ledger, core: Any, grace: Any) -> None:
    ledger = synced
    ledger.reserve(GpuRequest(gpus=1), "fresh", reservation_id="gp-fresh")
    with pytest.raises(InvalidRequestError, match="grace_seconds"):
        reconcile(ledger, core, grace_seconds=grace)
    with pytest.raises(InvalidRequestError, match="orphan_grace_seconds"):
        reconcile(ledger, core, orphan_grace_seconds=grace)
    with pytest.raises(InvalidRequestError, match="grace_seconds"):
        reconcile_grant(ledger, core, "gp-fresh", grace_seconds=grace)
    assert ledger.get("gp-fresh").state is ReservationState.GRANTED


def test_cli_reconcile_refuses_a_negative_grace_and_reports_orphans(
    tmp_path: Any, k8s: KubernetesEmulatorServer, core: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow_gpupool.cli import main

    url = f"sqlite:///{tmp_path}/cli.db"
    cluster = ["--url", url, "--kubeconfig", k8s.kubeconfig_path]
    assert main(["inventory", "sync", *cluster]) == 0
    assert main(["reserve", "--url", url, "--gpus", "1", "--id", "gp-cli-1", "--json"]) == 0
    capsys.readouterr()

    # Refused by argparse, before the ledger or the cluster is read (issue 12): exit 2 naming the option.
    for option, value in (("--grace-seconds", "-100"), ("--orphan-grace-seconds", "nan")):
        with pytest.raises(SystemExit) as refused:
            main(["reconcile", *cluster, f"{option}={value}"])
        assert refused.value.code == 2
        assert f"argument {option}: " in capsys.readouterr().err
    assert main(["reconcile", *cluster]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "reconcile: 0 released, 1 kept, 0 ignored; orphans: 0 kept, 0 released, 0 pod(s) deleted"
    )
    assert main(["reconcile", *cluster, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["orphans"] == {"kept": [], "released": [], "deleted": []}
