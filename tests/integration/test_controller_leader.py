"""Leader election through a Lease, against the Kubernetes emulator over HTTP; the emulator's Leases."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from airflow_gpupool.controller.leader import LeaderElector, LeaseSettings
from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.testing import KubernetesEmulatorServer
from tests.ledger_fixtures import FakeClock

DURATION = 15.0


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    with KubernetesEmulatorServer() as server:
        yield server


@pytest.fixture(scope="module")
def leases(emulator: KubernetesEmulatorServer) -> Any:
    return client.CoordinationV1Api(config.new_client_from_config(config_file=emulator.kubeconfig_path))


@pytest.fixture
def name() -> str:
    return f"lease-{uuid.uuid4().hex[:8]}"


def candidate(api: Any, name: str, identity: str, clock: FakeClock) -> LeaderElector:
    return LeaderElector(api, LeaseSettings("default", identity, name, DURATION), clock=clock)


# -- the emulator's Leases ----------------------------------------------------------------------


def lease_body(name: str, holder: str) -> Any:
    return client.V1Lease(
        metadata=client.V1ObjectMeta(name=name, namespace="default"),
        spec=client.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=10),
    )


def test_emulator_creates_reads_replaces_and_deletes_leases(leases: Any, name: str) -> None:
    created = leases.create_namespaced_lease("default", lease_body(name, "a"))
    assert created.metadata.uid and created.metadata.creation_timestamp
    with pytest.raises(ApiException) as exists:
        leases.create_namespaced_lease("default", lease_body(name, "a"))
    assert exists.value.status == 409
    read = leases.read_namespaced_lease(name, "default")
    read.spec.holder_identity = "b"
    replaced = leases.replace_namespaced_lease(name, "default", read)
    assert replaced.spec.holder_identity == "b"
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)
    assert replaced.metadata.uid == created.metadata.uid
    listed = leases.list_namespaced_lease("default")
    assert [
        (lease.metadata.name, lease.spec.holder_identity)
        for lease in listed.items
        if lease.metadata.name == name
    ] == [(name, "b")]
    leases.delete_namespaced_lease(name, "default")
    with pytest.raises(ApiException) as gone:
        leases.read_namespaced_lease(name, "default")
    assert gone.value.status == 404


def test_emulator_refuses_a_replace_with_a_stale_resource_version(leases: Any, name: str) -> None:
    leases.create_namespaced_lease("default", lease_body(name, "a"))
    first, second = (leases.read_namespaced_lease(name, "default") for _ in range(2))
    first.spec.holder_identity = "first"
    leases.replace_namespaced_lease(name, "default", first)
    second.spec.holder_identity = "second"
    with pytest.raises(ApiException) as conflict:
        leases.replace_namespaced_lease(name, "default", second)
    assert (conflict.value.status, json.loads(conflict.value.body)["reason"]) == (409, "Conflict")
    assert leases.read_namespaced_lease(name, "default").spec.holder_identity == "first"


def test_emulator_lists_leases_in_discovery(emulator: KubernetesEmulatorServer) -> None:
    def get(path: str) -> Any:
        with urllib.request.urlopen(emulator.url + path, timeout=10) as response:
            return json.loads(response.read())

    groups = {g["name"]: g["preferredVersion"]["groupVersion"] for g in get("/apis")["groups"]}
    assert groups["coordination.k8s.io"] == "coordination.k8s.io/v1"
    (resource,) = get("/apis/coordination.k8s.io/v1")["resources"]
    assert (resource["name"], resource["kind"], resource["namespaced"]) == ("leases", "Lease", True)
    assert {"get", "create", "update", "delete"} <= set(resource["verbs"])
    listed = get("/apis/coordination.k8s.io/v1/namespaces/default/leases")
    assert (listed["apiVersion"], listed["kind"]) == ("coordination.k8s.io/v1", "LeaseList")


# -- election -----------------------------------------------------------------------------------


def test_acquire_an_absent_lease(leases: Any, name: str) -> None:
    a = candidate(leases, name, "a", FakeClock(0))
    assert not a.is_leader()
    assert a.try_acquire_or_renew() and a.is_leader()
    spec = leases.read_namespaced_lease(name, "default").spec
    assert (spec.holder_identity, spec.lease_duration_seconds, spec.lease_transitions) == ("a", 15, 0)
    assert spec.acquire_time == spec.renew_time


def test_renew_moves_renew_time_and_keeps_acquire_time(leases: Any, name: str) -> None:
    clock = FakeClock(0)
    a = candidate(leases, name, "a", clock)
    a.try_acquire_or_renew()
    before = leases.read_namespaced_lease(name, "default")
    clock.advance(5)
    assert a.try_acquire_or_renew()
    after = leases.read_namespaced_lease(name, "default")
    assert after.spec.acquire_time == before.spec.acquire_time
    assert after.spec.renew_time > before.spec.renew_time
    assert int(after.metadata.resource_version) > int(before.metadata.resource_version)
    assert after.spec.lease_transitions == 0
    # Past the renew deadline (2/3 of the duration) without a renewal, the leader stops acting.
    clock.advance(DURATION * 2 / 3)
    assert not a.is_leader()


def test_a_second_candidate_waits_while_the_holder_renews(leases: Any, name: str) -> None:
    clock_a, clock_b = FakeClock(0), FakeClock(0)
    a, b = candidate(leases, name, "a", clock_a), candidate(leases, name, "b", clock_b)
    assert a.try_acquire_or_renew()
    for _ in range(4):  # b keeps trying for four lease durations, a renews in between
        assert not b.try_acquire_or_renew() and not b.is_leader()
        assert b.holder == "a"
        clock_a.advance(DURATION)
        clock_b.advance(DURATION)
        assert a.try_acquire_or_renew()
        clock_a.advance(-DURATION + 1)  # a renews well within its deadline
    assert leases.read_namespaced_lease(name, "default").spec.holder_identity == "a"


def test_takeover_after_the_lease_expires(leases: Any, name: str) -> None:
    clock_a, clock_b = FakeClock(0), FakeClock(0)
    a, b = candidate(leases, name, "a", clock_a), candidate(leases, name, "b", clock_b)
    assert a.try_acquire_or_renew()
    first = leases.read_namespaced_lease(name, "default").spec
    assert not b.try_acquire_or_renew()  # b sees a's record: its expiry counts from now
    clock_b.advance(DURATION - 0.1)
    assert not b.try_acquire_or_renew()
    clock_b.advance(0.2)
    assert b.try_acquire_or_renew() and b.is_leader()
    spec = leases.read_namespaced_lease(name, "default").spec
    assert (spec.holder_identity, spec.lease_transitions) == ("b", 1)
    assert spec.acquire_time > first.acquire_time
    # The old leader, back, finds the Lease taken and steps down.
    assert not a.try_acquire_or_renew() and not a.is_leader()
    assert a.holder == "b"


def test_a_write_on_a_stale_resource_version_loses(leases: Any, name: str) -> None:
    """Two candidates race for an expired Lease: the one whose read is stale gets 409 and does not lead."""
    clock = FakeClock(0)
    b = candidate(leases, name, "b", FakeClock(0))

    class RacingApi:
        """The real API, with b writing between a's read and a's replace."""

        def read_namespaced_lease(self, *args: Any) -> Any:
            lease = leases.read_namespaced_lease(*args)
            assert b.try_acquire_or_renew()
            return lease

        def replace_namespaced_lease(self, *args: Any) -> Any:
            return leases.replace_namespaced_lease(*args)

    leases.create_namespaced_lease("default", lease_body(name, ""))  # free: anyone may take it
    a = candidate(RacingApi(), name, "a", clock)
    assert not a.try_acquire_or_renew() and not a.is_leader()
    assert leases.read_namespaced_lease(name, "default").spec.holder_identity == "b"


def test_release_lets_the_next_candidate_in_at_once(leases: Any, name: str) -> None:
    a, b = candidate(leases, name, "a", FakeClock(0)), candidate(leases, name, "b", FakeClock(0))
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release() and not a.is_leader()
    assert leases.read_namespaced_lease(name, "default").spec.holder_identity is None
    assert b.try_acquire_or_renew()  # no waiting out the duration
    assert not a.release()  # not the holder: nothing to release
    assert leases.read_namespaced_lease(name, "default").spec.holder_identity == "b"


def test_a_leader_cut_off_from_the_api_server_steps_down_at_its_deadline() -> None:
    clock = FakeClock(0)
    with KubernetesEmulatorServer() as server:
        api = client.CoordinationV1Api(config.new_client_from_config(config_file=server.kubeconfig_path))
        a = candidate(api, "cut", "a", clock)
        assert a.try_acquire_or_renew()
    clock.advance(DURATION / 3)
    assert a.try_acquire_or_renew() and a.is_leader()  # the renewal failed, but within the deadline
    clock.advance(DURATION / 3)
    assert not a.try_acquire_or_renew() and not a.is_leader()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lease_duration": 0}, "lease duration"),
        ({"lease_duration": -1}, "lease duration"),
        ({"name": ""}, "name"),
    ],
    ids=["zero", "negative", "no-name"],
)
def test_bad_lease_settings(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        LeaseSettings(**{"namespace": "default", "identity": "a", **kwargs})
