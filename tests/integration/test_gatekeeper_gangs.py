"""Pod groups through the gatekeeper, against the emulator over HTTP, on SQLite and PostgreSQL ledgers.

Pods annotated ``gpupool.io/gang: NAME`` and ``gpupool.io/gang-size: N`` (built as Airflow builds
them: a V1Pod through the executor hook, then created) stay gated until the group's gang is
granted, then are ungated in one pass; an elastic group grows when capacity frees; malformed or
disagreeing groups are refused; the gang's leader is held until the group's last pod ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.client import ApiClient
from kubernetes.client import models as k8s_models

from airflow_gpupool.controller.gatekeeper import (
    REASON_ADMITTED,
    REASON_NO_CAPACITY,
    REASON_REFUSED,
    REASON_TIMED_OUT,
    gatekeep,
)
from airflow_gpupool.executor_hook import pod_mutation_hook
from airflow_gpupool.labels import RESERVATION_LABEL, SCHEDULING_GATE
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.integration.gatekeeper_fixtures import create_hooked_pod, messages
from tests.ledger_fixtures import FakeClock

ZONE = "topology.kubernetes.io/zone"
NODES = ("gpu-0", "gpu-1", "gpu-2", "gpu-3")


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    nodes = [
        gpu_node(name, gpus=1, taints=["nvidia.com/gpu=present:NoSchedule"], labels={ZONE: "zone-a"})
        for name in NODES[:3]
    ]
    with KubernetesEmulatorServer(nodes=nodes, default_duration_seconds=0.2) as server:
        yield server


def create_member(
    core: Any, name: str, gang: str, size: int, *, minimum: int | None = None, **annotations: str
) -> dict[str, Any]:
    """Build a one-GPU pod of group ``gang`` as KubernetesPodOperator would, run the hook on it, create it."""
    group = {"gpupool.io/gang": gang, "gpupool.io/gang-size": str(size)}
    if minimum is not None:
        group["gpupool.io/gang-min"] = str(minimum)
    return create_hooked_pod(
        core, name, {"nvidia.com/gpu": "1"}, dag_id="train", duration="120", **{**group, **annotations}
    )


def gated(k8s: KubernetesEmulatorServer, name: str) -> bool:
    pod = k8s.pod(name)
    assert pod is not None, name
    return any(g["name"] == SCHEDULING_GATE for g in pod["spec"].get("schedulingGates") or [])


def test_a_group_waits_for_its_pods_then_is_admitted_whole_in_one_pass(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    create_member(core, "g-a", "g", 3)
    create_member(core, "g-b", "g", 3)
    first = gatekeep(synced, core)
    assert first.admitted == [] and sorted(first.waiting) == ["default/g-a", "default/g-b"]
    assert synced.snapshot().queue == () and synced.snapshot().grants == ()  # nothing reserved

    create_member(core, "g-c", "g", 3)
    second = gatekeep(synced, core)
    assert sorted(second.admitted) == ["default/g-a", "default/g-b", "default/g-c"]
    grants = {r.id: r for r in synced.snapshot().grants}
    (leader,) = [r for r in grants.values() if r.gang_index == 0]
    gang = synced.gang(leader.id)
    assert len(gang.granted) == 3 and gang.spec.min_members == 3 and gang.spec.topology_keys == (ZONE,)
    assert leader.holder == "train/g-a/manual__1/map--1/try-1@gatekeeper"  # the oldest pod's task
    for name in ("g-a", "g-b", "g-c"):
        pod = k8s.pod(name)
        assert pod is not None and not gated(k8s, name)
        member = grants[pod["metadata"]["labels"][RESERVATION_LABEL]]
        assert member.gang_id == leader.id
        assert member.grant is not None
        assert (member.grant.pod_name, member.grant.pod_uid) == (name, pod["metadata"]["uid"])
        assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": member.grant.node}
        assert messages(k8s, name, REASON_ADMITTED)
    assert sorted(r.grant.node for r in grants.values() if r.grant) == list(NODES[:3])
    assert synced.check_invariants() == []


def test_a_group_with_room_for_fewer_than_its_minimum_stays_gated_until_all_fit(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    synced.reserve(GpuRequest(gpus=1), "someone-else", reservation_id="gp-blocker", ttl=3600)
    for name in ("h-a", "h-b", "h-c"):
        create_member(core, name, "h", 3)
    for _ in range(3):
        result = gatekeep(synced, core)
        assert result.admitted == [] and len(result.waiting) == 3
        assert all(gated(k8s, n) for n in ("h-a", "h-b", "h-c"))
    synced.release("gp-blocker")
    result = gatekeep(synced, core)
    assert sorted(result.admitted) == ["default/h-a", "default/h-b", "default/h-c"]
    assert not any(gated(k8s, n) for n in ("h-a", "h-b", "h-c"))


def test_an_elastic_group_is_admitted_at_its_minimum_and_grows_when_capacity_frees(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    synced.reserve(GpuRequest(gpus=1), "someone-else", reservation_id="gp-blocker", ttl=3600)
    names = ["e-0", "e-1", "e-2", "e-3"]
    for name in names:
        create_member(core, name, "e", 4, minimum=2)
    first = gatekeep(synced, core)
    assert sorted(first.admitted) == ["default/e-0", "default/e-1"]  # member order: by name
    assert sorted(first.waiting) == ["default/e-2", "default/e-3"]
    assert gatekeep(synced, core).admitted == []

    synced.release("gp-blocker")  # the ledger grows the gang by one member
    grown = gatekeep(synced, core)
    assert grown.admitted == ["default/e-2"]
    assert [n for n in names if gated(k8s, n)] == ["e-3"]
    labels = {k8s.pod(n)["metadata"]["labels"][RESERVATION_LABEL] for n in names[:3]}  # type: ignore[index]
    assert len(labels) == 3 and synced.check_invariants() == []


@pytest.mark.parametrize(
    ("annotations", "named"),
    [
        pytest.param({"gpupool.io/gang-size": "x"}, "gpupool.io/gang-size", id="size not a number"),
        pytest.param(
            {"gpupool.io/gang-size": "2", "gpupool.io/gang-min": "3"}, "gpupool.io/gang-min", id="min > size"
        ),
    ],
)
def test_a_malformed_group_is_refused_with_an_event_and_deleted(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, annotations: dict[str, str], named: str
) -> None:
    create_member(core, "bad", "b", 2, **annotations)
    result = gatekeep(synced, core)
    assert [pod for pod, _ in result.deleted] == ["default/bad"]
    assert k8s.pod("bad") is None
    (message,) = messages(k8s, "bad", REASON_REFUSED)
    assert named in message
    assert synced.snapshot().queue == ()


def test_pods_that_disagree_or_outnumber_the_size_are_refused(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    create_member(core, "d-a", "d", 2)
    create_member(core, "d-b", "d", 3)
    create_member(core, "o-a", "o", 1)
    create_member(core, "o-b", "o", 1)
    result = gatekeep(synced, core)
    assert sorted(pod for pod, _ in result.deleted) == [
        "default/d-a",
        "default/d-b",
        "default/o-a",
        "default/o-b",
    ]
    (message,) = messages(k8s, "d-a", REASON_REFUSED)
    assert "gpupool.io/gang-size" in message and "d-a='2'" in message and "d-b='3'" in message
    (message,) = messages(k8s, "o-b", REASON_REFUSED)
    assert "the 2 pods of gang o" in message
    assert synced.snapshot().queue == () and synced.snapshot().grants == ()


def test_the_leaders_slice_is_held_until_the_groups_last_pod_ends(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    for name in ("l-a", "l-b", "l-c"):
        create_member(core, name, "l", 3)
    assert len(gatekeep(synced, core).admitted) == 3
    for name in ("l-a", "l-b", "l-c"):
        k8s.wait_for_pod(name, phases={"Running"})
    grants = {r.grant.pod_name: r for r in synced.snapshot().grants if r.grant is not None}
    leader = next(r for r in grants.values() if r.gang_index == 0)
    leader_pod = leader.grant.pod_name  # type: ignore[union-attr]
    others = sorted(n for n in grants if n != leader_pod)

    k8s.finish_pod(leader_pod)
    k8s.wait_for_pod(leader_pod, timeout=10)
    kept = gatekeep(synced, core)
    assert kept.released == []
    assert all(synced.get(r.id).state is ReservationState.GRANTED for r in grants.values())

    k8s.finish_pod(others[0])
    k8s.wait_for_pod(others[0], timeout=10)
    one = gatekeep(synced, core)
    assert one.released == [grants[others[0]].id]  # a member alone; the leader still held
    assert synced.get(leader.id).state is ReservationState.GRANTED

    core.delete_namespaced_pod(others[1], "default")
    k8s.wait_for_pod_gone(others[1])  # the DELETE answers while the pod terminates
    last = gatekeep(synced, core)
    assert leader.id in last.released  # the gang ends with the group's last pod
    assert all(synced.get(r.id).state.ended for r in grants.values())
    assert synced.snapshot().grants == () and synced.check_invariants() == []


# -- a hypothesis test of groups, singles, passes and pods ending --------------------------------

_ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("group"), st.integers(1, 3), st.integers(1, 3), st.integers(0, 3)),
        st.tuples(st.just("single")),
        st.tuples(st.just("pass")),
        st.tuples(st.just("end"), st.integers(0, 30)),
    ),
    min_size=4,
    max_size=14,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=_ACTIONS)
def test_no_group_is_ever_partly_ungated(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, actions: list[tuple[Any, ...]]
) -> None:
    k8s.reset()
    for r in synced.snapshot().grants + synced.snapshot().queue:
        synced.release(r.id, reason="next example")
    minimum: dict[str, int] = {}  # group -> its min
    members: dict[str, list[str]] = {}  # group -> its pods
    ever_ungated: set[str] = set()
    made = 0
    for action in actions:
        made += 1
        if action[0] == "group":
            _, size, min_part, created = action
            group, low = f"g{made}", min(min_part, size)
            minimum[group] = low
            members[group] = [f"{group}-{i}" for i in range(min(created, size))]
            for name in members[group]:
                create_member(core, name, group, size, minimum=low)
        elif action[0] == "single":
            pod = k8s_models.V1Pod(
                metadata=k8s_models.V1ObjectMeta(
                    name=f"s{made}", annotations={"gpupool.emulator/duration-seconds": "120"}
                ),
                spec=k8s_models.V1PodSpec(
                    containers=[
                        k8s_models.V1Container(
                            name="base",
                            image="x:1",
                            resources=k8s_models.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}),
                        )
                    ]
                ),
            )
            pod_mutation_hook(pod)
            core.create_namespaced_pod("default", ApiClient().sanitize_for_serialization(pod))
        elif action[0] == "end":
            live = [p["metadata"]["name"] for p in k8s.pods() if p["metadata"]["name"] in ever_ungated]
            if live:
                core.delete_namespaced_pod(live[action[1] % len(live)], "default")
        else:
            gatekeep(synced, core)
            for pod in k8s.pods():
                if not pod["spec"].get("schedulingGates"):
                    ever_ungated.add(pod["metadata"]["name"])
            for group, names in members.items():
                admitted = len(ever_ungated & set(names))
                assert admitted == 0 or admitted >= minimum[group], (group, sorted(ever_ungated & set(names)))
            assert synced.check_invariants() == []


def test_reconcile_keeps_a_gang_leader_whose_pod_finished_while_its_members_run(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    from airflow_gpupool.controller.reconcile import reconcile

    for name in ("r-a", "r-b"):
        create_member(core, name, "r", 2)
    assert len(gatekeep(synced, core).admitted) == 2
    for name in ("r-a", "r-b"):
        k8s.wait_for_pod(name, phases={"Running"})
    leader = next(r for r in synced.snapshot().grants if r.gang_index == 0)
    leader_pod = leader.grant.pod_name  # type: ignore[union-attr]
    k8s.finish_pod(leader_pod)
    k8s.wait_for_pod(leader_pod, timeout=10)
    result = reconcile(synced, core)
    assert result.released == () and leader.id in result.kept
    assert len(synced.gang(leader.id).granted) == 2


def test_a_gang_that_times_out_or_can_never_fit_refuses_every_gated_pod(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, clock: FakeClock
) -> None:
    synced.reserve(GpuRequest(gpus=1), "someone-else", reservation_id="gp-blocker", ttl=3600)
    for name in ("t-a", "t-b", "t-c"):
        create_member(core, name, "t", 3)
    for name in ("n-a", "n-b", "n-c", "n-d"):
        create_member(core, name, "n", 4)  # 4 members, 3 GPUs in the pool
    first = gatekeep(synced, core, timeout=5)
    assert sorted(first.waiting) == ["default/t-a", "default/t-b", "default/t-c"]
    assert sorted(pod for pod, _ in first.deleted) == [
        "default/n-a",
        "default/n-b",
        "default/n-c",
        "default/n-d",
    ]
    assert messages(k8s, "n-d", REASON_NO_CAPACITY)
    clock.advance(10)
    synced.reap()
    second = gatekeep(synced, core, timeout=5)
    assert sorted(pod for pod, _ in second.deleted) == ["default/t-a", "default/t-b", "default/t-c"]
    for name in ("t-a", "t-b", "t-c"):
        (message,) = messages(k8s, name, REASON_TIMED_OUT)
        assert "timed_out" in message and k8s.pod(name) is None


def test_a_running_groups_gang_is_renewed_once_per_pass_when_due(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, clock: FakeClock
) -> None:
    for name in ("w-a", "w-b", "w-c"):
        create_member(core, name, "w", 3)
    assert len(gatekeep(synced, core).admitted) == 3
    assert gatekeep(synced, core).renewed == 0  # not due yet
    leader = next(r for r in synced.snapshot().grants if r.gang_index == 0)
    assert leader.grant is not None
    clock.advance((leader.grant.expires_at - clock()) * 0.75)
    assert gatekeep(synced, core).renewed == 1  # one renewal renews every member
    expiries = {r.grant.expires_at for r in synced.snapshot().grants if r.grant is not None}
    assert len(expiries) == 1 and expiries.pop() > leader.grant.expires_at
