"""A gated pod's promise to checkpoint on SIGTERM, against the emulator over HTTP, on SQLite and PostgreSQL.

``gpupool.io/checkpoint-on-sigterm: "true"`` is ``GpuPodOperator(checkpoint_on_sigterm=True)`` for
pods the operator did not build: the ledger stores it and ranks such a preemption victim as
checkpointed now. A promise with nowhere to write the checkpoint (no ``GPUPOOL_CHECKPOINT_DIR``
in a container) is refused, whether the executor hook or the gatekeeper finds it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_gpupool.controller.gatekeeper import REASON_REFUSED, gated_reservation_id, gatekeep
from airflow_gpupool.labels import (
    BINDING_ANNOTATION,
    CHECKPOINT_ON_SIGTERM_KEY,
    REQUEST_ANNOTATION,
    SCHEDULING_GATE,
)
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.integration.gatekeeper_fixtures import create_hooked_pod, messages
from tests.ledger_fixtures import FakeClock

GPU = {"nvidia.com/gpu": "1"}
CKPT = {"GPUPOOL_CHECKPOINT_DIR": "s3://ckpt/train"}
TRAINING = '{"workload_class": "training", "preemptible": true}'
MIN_RUNTIME = 60.0


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    nodes = [gpu_node(f"gpu-{i}", gpus=1, labels={"topology.kubernetes.io/zone": "zone-a"}) for i in range(2)]
    with KubernetesEmulatorServer(nodes=nodes, default_duration_seconds=0.2) as server:
        yield server


@pytest.fixture
def ledger(make_ledger: Callable[..., Ledger]) -> Ledger:
    return make_ledger(min_runtime_seconds=MIN_RUNTIME)


def rid(pod: dict[str, Any]) -> str:
    return gated_reservation_id(pod["metadata"]["uid"])


@pytest.mark.parametrize("promised", [True, False], ids=["promises", "does-not"])
def test_a_gated_pods_promise_is_stored_and_ranks_it_as_checkpointed_now(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, clock: FakeClock, promised: bool
) -> None:
    # As the ledger's own test: equal priority, so only the work lost tells them apart; without
    # the promise "sigterm" loses more (no checkpoint at all) and is the newer grant.
    training = {REQUEST_ANNOTATION: TRAINING}
    periodic = create_hooked_pod(core, "periodic", GPU, duration="600", env=CKPT, **training)
    assert gatekeep(synced, core).admitted == ["default/periodic"]
    clock.advance(1)
    promise = {CHECKPOINT_ON_SIGTERM_KEY: str(promised).lower()}
    sigterm = create_hooked_pod(core, "sigterm", GPU, duration="600", env=CKPT, **training, **promise)
    assert gatekeep(synced, core).admitted == ["default/sigterm"]
    assert synced.get(rid(sigterm)).request.checkpoint_on_sigterm is promised
    clock.advance(MIN_RUNTIME + 60)
    assert synced.note_checkpoint(rid(periodic), clock.now - 10)

    urgent = synced.reserve(GpuRequest(gpus=1, priority=100), "urgent", reservation_id="gp-urgent")

    assert urgent.state is ReservationState.WAITING
    victim, kept = (sigterm, periodic) if promised else (periodic, sigterm)
    assert synced.get(rid(victim)).state is ReservationState.PREEMPTING
    assert synced.get(rid(kept)).state is ReservationState.GRANTED


def test_a_promise_with_nowhere_to_write_is_refused_by_the_hook_and_the_pod_deleted(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    create_hooked_pod(core, "no-dir", GPU, **{CHECKPOINT_ON_SIGTERM_KEY: "true"})
    assert [name for name, _ in gatekeep(synced, core).deleted] == ["default/no-dir"]
    (message,) = messages(k8s, "no-dir", REASON_REFUSED)
    assert "checkpoint_on_sigterm" in message and "GPUPOOL_CHECKPOINT_DIR" in message
    assert synced.snapshot().queue == () and synced.snapshot().grants == ()


def test_the_gatekeeper_refuses_a_promise_written_past_the_hook(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    # Annotated by hand, as the hook would never write it: the gatekeeper checks the pod itself.
    annotations = {
        REQUEST_ANNOTATION: '{"gpus": 1, "cpu_milli": 0, "checkpoint_on_sigterm": true}',
        BINDING_ANNOTATION: "whole",
    }
    body = {
        "metadata": {"name": "by-hand", "annotations": annotations},
        "spec": {
            "schedulingGates": [{"name": SCHEDULING_GATE}],
            "containers": [{"name": "base", "image": "train:1", "resources": {"limits": GPU}}],
        },
    }
    core.create_namespaced_pod("default", body)

    assert [name for name, _ in gatekeep(synced, core).deleted] == ["default/by-hand"]
    (message,) = messages(k8s, "by-hand", REASON_REFUSED)
    assert "checkpoint_on_sigterm" in message
    assert synced.snapshot().queue == () and synced.snapshot().grants == ()


def test_a_pod_groups_promise_goes_into_its_gang_request(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    group = {"gpupool.io/gang": "g", "gpupool.io/gang-size": "2", CHECKPOINT_ON_SIGTERM_KEY: "true"}
    for name in ("g-0", "g-1"):
        create_hooked_pod(core, name, GPU, duration="30", env=CKPT, **{REQUEST_ANNOTATION: TRAINING}, **group)

    assert sorted(gatekeep(synced, core).admitted) == ["default/g-0", "default/g-1"]
    members = synced.snapshot().grants
    assert len(members) == 2 and all(m.request.checkpoint_on_sigterm for m in members)
