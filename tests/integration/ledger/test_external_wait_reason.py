"""Why a request waits names the pods the ledger did not grant, where they are what blocks it (SQLite and PostgreSQL)."""

from __future__ import annotations

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.pod_gpus import ExternalPod, GpuUse
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node


def foreign(name: str, node_name: str, gpus: int) -> ExternalPod:
    return ExternalPod("default", name, f"uid-{name}", node_name, GpuUse(whole=gpus))


def test_the_external_pods_that_block_a_request_are_named_by_node(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("gpu-a", gpus=4), node("gpu-b", gpus=2)])
    ledger.sync_external([foreign("notebook", "gpu-a", 3), foreign("infer", "gpu-a", 1)])
    ledger.sync_external([foreign("small", "gpu-b", 1)])
    waiting = ledger.reserve(GpuRequest(gpus=4), "h", timeout=600)
    assert waiting.state is ReservationState.WAITING

    message = ledger.explain(waiting.id)

    assert (
        "gpu-a: 4 GPUs held by pods the ledger did not grant (external:default/infer, external:default/notebook)"
        in message
    )
    assert "gpu-b: 1 GPUs held" not in message  # 1 free and 1 external: not enough for 4


def test_external_pods_that_are_not_what_blocks_are_not_named(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("gpu-a", gpus=4)])
    ledger.reserve(GpuRequest(gpus=3), "granted", ttl=3600)
    ledger.sync_external([foreign("notebook", "gpu-a", 1)])
    waiting = ledger.reserve(GpuRequest(gpus=4), "h", timeout=600)

    message = ledger.explain(waiting.id)

    assert "waited" in message and "did not grant" not in message
