"""GPUs a pod holds through DRA ResourceClaims (airflow_gpupool.pod_gpus with a claim lookup)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from airflow_gpupool.pod_gpus import GpuUse, claim_keys, external_pod, gpu_use


def dra_pod(
    *refs: dict[str, str], statuses: list[dict[str, str]] | None = None, gpus: int = 0
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    spec = {
        "nodeName": "n1",
        "containers": [{"name": "a", "resources": {"limits": limits, "claims": [{"name": "gpu"}]}}],
        "resourceClaims": list(refs),
    }
    status: dict[str, Any] = {"phase": "Running"}
    if statuses is not None:
        status["resourceClaimStatuses"] = statuses
    return {"metadata": {"name": "p", "namespace": "ml", "uid": "u1"}, "spec": spec, "status": status}


def claim(name: str, *devices: str, driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    results = [{"request": "gpu", "driver": driver, "pool": "n1", "device": d} for d in devices]
    return {
        "metadata": {"name": name, "namespace": "ml"},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}],
        },
    }


def lookup(*claims: Mapping[str, Any]) -> Any:
    by_key = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
    asked: list[tuple[str, str, str]] = []

    def read(namespace: str, name: str, uid: str) -> Mapping[str, Any] | None:
        asked.append((namespace, name, uid))
        return by_key.get((namespace, name))

    read.asked = asked  # type: ignore[attr-defined]
    return read


NAMED = {"name": "gpu", "resourceClaimName": "train-gpu"}
TEMPLATED = {"name": "gpu", "resourceClaimTemplateName": "two-gpus"}


@pytest.mark.parametrize(
    ("pod", "claims", "expected"),
    [
        pytest.param(
            dra_pod(NAMED),
            [claim("train-gpu", "gpu-3", "gpu-1")],
            GpuUse(whole=2, gpu_indices=(1, 3)),
            id="named-claim-held-on-its-devices",
        ),
        pytest.param(
            dra_pod(TEMPLATED, statuses=[{"name": "gpu", "resourceClaimName": "p-gpu-x7k2q"}]),
            [claim("p-gpu-x7k2q", "gpu-0")],
            GpuUse(whole=1, gpu_indices=(0,)),
            id="template-claim-by-its-generated-name",
        ),
        pytest.param(
            dra_pod(NAMED, gpus=1),
            [claim("train-gpu", "gpu-2")],
            GpuUse(whole=2, gpu_indices=(2,)),
            id="device-plugin-gpu-beside-a-claim",
        ),
        pytest.param(
            dra_pod(NAMED),
            [claim("train-gpu", "eth-0", driver="net.example.com")],
            GpuUse(),
            id="another-drivers-devices-hold-no-gpu",
        ),
        pytest.param(
            dra_pod(NAMED), [], GpuUse(waiting="ResourceClaim ml/train-gpu is not found"), id="not-found"
        ),
        pytest.param(
            dra_pod(NAMED),
            [{"metadata": {"name": "train-gpu", "namespace": "ml"}, "status": {}}],
            GpuUse(waiting="ResourceClaim ml/train-gpu is not allocated yet"),
            id="not-allocated",
        ),
        pytest.param(
            dra_pod(NAMED),
            [{**claim("train-gpu", "gpu-0"), "status": {**claim("x", "gpu-0")["status"], "reservedFor": []}}],
            GpuUse(waiting="ResourceClaim ml/train-gpu is not reserved for the pod yet"),
            id="allocated-but-reserved-for-another-pod",
        ),
        pytest.param(
            dra_pod(TEMPLATED, statuses=[]),
            [],
            GpuUse(waiting="the ResourceClaim of template two-gpus is not made yet"),
            id="template-claim-not-made",
        ),
        pytest.param(
            dra_pod(NAMED),
            [claim("train-gpu", "gpu-0-mig-9-4-4")],
            GpuUse(
                unreadable="ResourceClaim ml/train-gpu: device 'gpu-0-mig-9-4-4' of gpu.nvidia.com "
                "is not a whole GPU (gpu-<index>)"
            ),
            id="mig-device-unreadable",
        ),
    ],
)
def test_gpus_read_from_claims(pod: dict[str, Any], claims: list[dict[str, Any]], expected: GpuUse) -> None:
    assert gpu_use(pod, lookup(*claims)) == expected


def test_the_lookup_is_asked_for_the_pods_claim_and_uid() -> None:
    read = lookup(claim("train-gpu", "gpu-0"))
    gpu_use(dra_pod(NAMED), read)
    assert read.asked == [("ml", "train-gpu", "u1")]


def test_a_waiting_pod_is_not_counted_and_an_allocated_one_is() -> None:
    assert external_pod(dra_pod(NAMED), lookup()) is None
    counted = external_pod(dra_pod(NAMED), lookup(claim("train-gpu", "gpu-1")))
    assert counted is not None and counted.use == GpuUse(whole=1, gpu_indices=(1,))


def test_without_a_lookup_claims_are_not_read() -> None:
    assert gpu_use(dra_pod(NAMED)) == GpuUse()


def test_a_template_claim_kubernetes_did_not_need_names_nothing() -> None:
    assert claim_keys(dra_pod(TEMPLATED, statuses=[{"name": "gpu"}])) == ()
