"""The spot rule on the gatekeeper path: gated plain pods are reserved where GpuPodOperator's would be.

The emulator over HTTP with one on-demand node and one spot node (Karpenter's label), inventory
synced into SQLite and PostgreSQL ledgers; pods built as KubernetesPodOperator builds them, gated
by the executor hook, admitted by one gatekeeper pass each.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_gpupool.controller.gatekeeper import gated_reservation_id, gatekeep
from airflow_gpupool.labels import CAPACITY_TYPE_LABEL, PRIORITY_KEY, REQUEST_ANNOTATION
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.integration.gatekeeper_fixtures import create_hooked_pod

SPOT = {"karpenter.sh/capacity-type": "spot"}
TRAINING = '{"workload_class": "training", "preemptible": true}'


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    nodes = [gpu_node("od-0", gpus=1), gpu_node("spot-0", gpus=1, labels=SPOT)]
    with KubernetesEmulatorServer(nodes=nodes, default_duration_seconds=0.2) as server:
        yield server


def admitted_node(k8s: KubernetesEmulatorServer, name: str) -> str:
    return str(k8s.wait_for_pod(name, timeout=10)["spec"]["nodeName"])


def test_an_urgent_gated_pod_waits_for_on_demand_rather_than_run_on_free_spot(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    synced.reserve(
        GpuRequest(gpus=1, node_labels=((CAPACITY_TYPE_LABEL, "on-demand"),)), "else", reservation_id="gp-od"
    )
    created = create_hooked_pod(core, "urgent", {"nvidia.com/gpu": "1"}, **{PRIORITY_KEY: "100"})
    rid = gated_reservation_id(created["metadata"]["uid"])

    assert gatekeep(synced, core).waiting == ["default/urgent"]  # spot-0 is free, and not for it
    assert dict(synced.get(rid).request.node_labels) == {CAPACITY_TYPE_LABEL: "on-demand"}

    synced.release("gp-od")
    assert gatekeep(synced, core).admitted == ["default/urgent"]
    assert admitted_node(k8s, "urgent") == "od-0"


def test_an_urgent_pod_that_asks_for_spot_in_its_node_selector_gets_spot(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    create_hooked_pod(
        core, "urgent-spot", {"nvidia.com/gpu": "1"}, node_selector=SPOT, **{PRIORITY_KEY: "100"}
    )
    assert gatekeep(synced, core).admitted == ["default/urgent-spot"]
    assert admitted_node(k8s, "urgent-spot") == "spot-0"


def test_checkpointed_preemptible_training_prefers_cheap_spot(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__SPOT_PRICE_RATIO", "0.3")
    env = {"GPUPOOL_CHECKPOINT_DIR": "s3://ckpt/train"}
    created = create_hooked_pod(
        core, "train", {"nvidia.com/gpu": "1"}, env=env, **{REQUEST_ANNOTATION: TRAINING}
    )
    assert gatekeep(synced, core).admitted == ["default/train"]
    assert admitted_node(k8s, "train") == "spot-0"
    reservation = synced.get(gated_reservation_id(created["metadata"]["uid"]))
    assert dict(reservation.request.prefer_node_labels) == {CAPACITY_TYPE_LABEL: "spot"}
    assert reservation.state is ReservationState.GRANTED


def test_a_malformed_option_fails_the_pass_and_refuses_no_pod(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_gpupool.exceptions import ConfigurationError

    create_hooked_pod(core, "kept", {"nvidia.com/gpu": "1"})
    monkeypatch.setenv("AIRFLOW__GPUPOOL__URGENT_PRIORITY", "high")
    with pytest.raises(ConfigurationError, match="urgent_priority"):
        gatekeep(synced, core)
    assert k8s.pod("kept") is not None
