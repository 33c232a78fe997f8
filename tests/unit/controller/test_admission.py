"""The gatekeeper's admission patch: only the keys it sets are written, gates removed exactly."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from airflow_gpupool.controller.admission import GPU_TOLERATION, admission_patch
from airflow_gpupool.labels import GPUS_ANNOTATION, NODE_ANNOTATION, RESERVATION_LABEL, SCHEDULING_GATE
from airflow_gpupool.ledger import Grant

GRANT = Grant(
    node="gpu-1",
    node_pool="default",
    gpu_indices=(0, 1),
    gpu_uuids=(),
    gpu_model=None,
    milli_per_gpu=1000,
    gpu_memory_mib=0,
    mig_slice=None,
    mig_profile=None,
    granted_at=0.0,
    expires_at=60.0,
)
OURS = {"name": SCHEDULING_GATE}
OTHER_GATE = {"name": "example.com/other"}


def gated(**parts: Any) -> dict[str, Any]:
    meta = {"name": "p", "namespace": "default", **parts.pop("meta", {})}
    return {"metadata": meta, "spec": {"containers": [{"name": "c"}], "schedulingGates": [OURS], **parts}}


@pytest.mark.parametrize(
    ("pod", "expected_paths"),
    [
        pytest.param(
            gated(),
            [
                "/metadata/labels",
                "/metadata/annotations",
                "/spec/nodeSelector",
                "/spec/tolerations",
                "/spec/schedulingGates",
            ],
            id="bare pod: whole maps added",
        ),
        pytest.param(
            gated(
                meta={"labels": {"team": "ml"}, "annotations": {"a": "1"}},
                nodeSelector={"zone": "a"},
                tolerations=[{"key": "spot", "operator": "Exists"}],
                schedulingGates=[OURS, OTHER_GATE],
            ),
            [
                "/metadata/labels/gpupool.io~1reservation-id",
                "/metadata/annotations/gpupool.io~1reservation-id",
                f"/metadata/annotations/{NODE_ANNOTATION.replace('/', '~1')}",
                f"/metadata/annotations/{GPUS_ANNOTATION.replace('/', '~1')}",
                "/spec/nodeSelector/kubernetes.io~1hostname",
                "/spec/tolerations/-",
                "/spec/schedulingGates",
            ],
            id="existing maps: one op per key, other gates kept",
        ),
        pytest.param(
            gated(
                meta={"labels": {RESERVATION_LABEL: "gp-1"}},
                tolerations=[dict(GPU_TOLERATION)],
            ),
            [
                "/metadata/annotations",
                "/spec/nodeSelector",
                "/spec/schedulingGates",
            ],
            id="what is already set is not written again",
        ),
    ],
)
def test_the_patch_writes_only_what_changes(pod: dict[str, Any], expected_paths: list[str]) -> None:
    ops = admission_patch(pod, "gp-1", GRANT)
    assert [op["path"] for op in ops] == expected_paths

    patched = jsonpatch.apply_patch(copy.deepcopy(pod), ops)

    meta, spec = patched["metadata"], patched["spec"]
    assert meta["labels"] == {**(pod["metadata"].get("labels") or {}), RESERVATION_LABEL: "gp-1"}
    assert meta["annotations"][NODE_ANNOTATION] == "gpu-1"
    assert meta["annotations"][GPUS_ANNOTATION] == "0,1"
    assert spec["nodeSelector"] == {
        **(pod["spec"].get("nodeSelector") or {}),
        "kubernetes.io/hostname": "gpu-1",
    }
    assert [t for t in spec["tolerations"] if t["key"] == GPU_TOLERATION["key"]] == [GPU_TOLERATION]
    old_tolerations = pod["spec"].get("tolerations") or []
    assert spec["tolerations"][: len(old_tolerations)] == old_tolerations  # kept, in order
    assert spec.get("schedulingGates", []) == [g for g in pod["spec"]["schedulingGates"] if g != OURS]
    for key, value in (pod["metadata"].get("annotations") or {}).items():
        assert meta["annotations"][key] == value  # other keys untouched
