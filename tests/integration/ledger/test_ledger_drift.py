"""Drift on SQLite and PostgreSQL: each node's books beside the pods the API server lists."""

from __future__ import annotations

from typing import Any

from airflow_gpupool.labels import RESERVATION_LABEL
from airflow_gpupool.ledger import Ledger, NodeDrift, ledger_drift
from airflow_gpupool.pod_gpus import external_pod
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node


def pod_json(
    name: str,
    node_name: str = "n1",
    *,
    gpus: int | str = 0,
    mig: dict[str, int] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
    namespace: str = "ml",
) -> dict[str, Any]:
    limits: dict[str, Any] = {f"nvidia.com/mig-{p}": n for p, n in (mig or {}).items()}
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": phase},
    }


def counted(ledger: Ledger, *pods: dict[str, Any]) -> None:
    found = [p for p in (external_pod(x) for x in pods) if p is not None]
    ledger.sync_external(found, complete=True)


def by_node(rows: list[NodeDrift]) -> dict[str, NodeDrift]:
    return {r.node: r for r in rows}


def test_books_that_count_every_pod_show_no_drift(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    ledger.upsert_nodes([node("n2", gpus=2)])
    mine = ledger.reserve(GpuRequest(gpus=1), "h", reservation_id="gp-1")
    assert mine.grant is not None
    pods = [pod_json("train", mine.grant.node, gpus=1, labels={RESERVATION_LABEL: "gp-1"})]
    pods.append(pod_json("notebook", "n1", gpus=2))
    counted(ledger, *pods)

    rows = by_node(ledger_drift(ledger.snapshot(), pods))

    n1, n2 = rows["n1"], rows["n2"]
    assert (n1.capacity, n1.external, n1.running, n1.drift, n1.mismatched) == (4, 2, 2 + n1.granted, 0, ())
    assert (n2.capacity, n2.running, n2.drift, n2.mismatched) == (2, n2.granted, 0, ())
    assert n1.granted + n2.granted == 1 and n1.free == 2 - n1.granted


def test_a_pod_the_ledger_missed_is_drift_on_its_node(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    pods = [pod_json("notebook", gpus=4)]

    (n1,) = ledger_drift(ledger.snapshot(), pods)

    assert (n1.held, n1.running, n1.drift) == (0, 4, 4)
    assert n1.mismatched == ("external:ml/notebook: 0 → 4",)


def test_a_grant_without_a_pod_and_a_missed_pod_do_not_cancel(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    lost = ledger.reserve(GpuRequest(gpus=2), "h", reservation_id="gp-lost")
    assert lost.grant is not None
    pods = [pod_json("notebook", gpus=2)]

    (n1,) = ledger_drift(ledger.snapshot(), pods)

    assert n1.held == n1.running == 2  # |held - running| alone would say 0
    assert n1.drift == 4
    assert n1.mismatched == ("external:ml/notebook: 0 → 2", "grant gp-lost: 2 → 0")


def test_finished_and_unscheduled_pods_run_nothing(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    pods = [pod_json("done", gpus=1, phase="Succeeded"), pod_json("pending", node_name="", gpus=1)]

    (n1,) = ledger_drift(ledger.snapshot(), pods)

    assert (n1.running, n1.drift) == (0, 0)


def test_mig_slices_count_their_share_of_a_gpu(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=1, mig={0: ["1g.10gb"] * 7})])
    pods = [pod_json("infer", mig={"1g.10gb": 2})]
    (before,) = ledger_drift(ledger.snapshot(), pods)
    counted(ledger, *pods)

    (after,) = ledger_drift(ledger.snapshot(), pods)

    assert before.drift == after.running == after.external == round(2 / 7, 3)
    assert after.drift == 0


def test_an_unreadable_pod_runs_what_the_ledger_holds_for_it(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    pods = [pod_json("odd", gpus="two")]
    counted(ledger, *pods)

    (n1,) = ledger_drift(ledger.snapshot(), pods)

    assert (n1.external, n1.running, n1.drift) == (4, 4, 0)


def test_without_a_pod_list_only_the_ledger_side_is_given(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    ledger.reserve(GpuRequest(gpus=1), "h")

    (n1,) = ledger_drift(ledger.snapshot())

    assert n1.to_dict() == {
        "node": "n1",
        "capacity_gpus": 2,
        "granted_gpus": 1,
        "external_gpus": 0,
        "free_gpus": 1,
        "running_gpus": None,
        "drift_gpus": None,
        "mismatched": [],
    }


def dra_pod(name: str) -> dict[str, Any]:
    pod = pod_json(name)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]
    return pod


def allocated(*devices: str) -> Any:
    results = [{"driver": "gpu.nvidia.com", "device": d} for d in devices]

    def lookup(namespace: str, name: str, uid: str) -> dict[str, Any]:
        reserved = [{"resource": "pods", "uid": uid}]
        return {"status": {"allocation": {"devices": {"results": results}}, "reservedFor": reserved}}

    return lookup


def test_a_claimed_pod_runs_its_claims_gpus_when_the_claims_are_read(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    vllm = dra_pod("vllm")
    ledger.sync_external([external_pod(vllm, allocated("gpu-1", "gpu-3"))], complete=True)

    (n1,) = ledger_drift(ledger.snapshot(), [vllm], allocated("gpu-1", "gpu-3"))
    assert (n1.external, n1.running, n1.drift) == (2, 2, 0)
    (n1,) = ledger_drift(ledger.snapshot(), [vllm], allocated("gpu-1"))  # one GPU the books hold idle
    assert (n1.running, n1.drift, n1.mismatched) == (1, 1, ("external:ml/vllm: 2 → 1",))


def test_a_claimed_pod_runs_what_the_ledger_holds_when_no_claim_is_read(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    vllm, missed = dra_pod("vllm"), dra_pod("missed")
    ledger.sync_external([external_pod(vllm, allocated("gpu-0", "gpu-2"))], complete=True)

    (n1,) = ledger_drift(ledger.snapshot(), [vllm, missed])  # gpupool status and the exporter read no claim

    assert (n1.external, n1.running, n1.drift, n1.mismatched) == (2, 2, 0, ())
