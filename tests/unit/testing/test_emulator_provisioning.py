"""The emulator checks ProvisioningRequests as the CRD's schema does, and reports conditions as Cluster Autoscaler does."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_gpupool.testing.api.gates import KubernetesInvalid
from airflow_gpupool.testing.cluster import provisioning


def request(**spec: Any) -> dict[str, Any]:
    base = {
        "provisioningClassName": provisioning.BEST_EFFORT_ATOMIC,
        "podSets": [{"count": 1, "podTemplateRef": {"name": "t"}}],
    }
    return {"metadata": {"name": "p"}, "spec": {**base, **spec}}


INVALID = {
    "no class": (request(provisioningClassName=""), "spec.provisioningClassName: Required value"),
    "no pod sets": (request(podSets=[]), "spec.podSets: Invalid value"),
    "a count of 0": (
        request(podSets=[{"count": 0, "podTemplateRef": {"name": "t"}}]),
        "spec.podSets[0].count",
    ),
    "no template": (request(podSets=[{"count": 1}]), "spec.podSets[0].podTemplateRef.name: Required value"),
}


@pytest.mark.parametrize("case", INVALID, ids=list(INVALID))
def test_an_invalid_request_is_refused(case: str) -> None:
    obj, message = INVALID[case]
    with pytest.raises(KubernetesInvalid, match="ProvisioningRequest") as raised:
        provisioning.check_create(obj)
    assert message in str(raised.value)


def test_the_spec_is_immutable_the_status_is_not() -> None:
    current = request()
    provisioning.check_create(current)
    provisioning.check_update(current, {**current, "status": {"conditions": []}})
    with pytest.raises(KubernetesInvalid, match="immutable"):
        provisioning.check_update(current, request(podSets=[{"count": 2, "podTemplateRef": {"name": "t"}}]))


def test_a_condition_keeps_its_transition_time_until_its_status_changes() -> None:
    obj = request()
    provisioning.set_condition(obj, provisioning.ACCEPTED, True, "Accepted", "")
    first = obj["status"]["conditions"][0]["lastTransitionTime"]
    obj["status"]["conditions"][0]["lastTransitionTime"] = "2000-01-01T00:00:00Z"
    provisioning.set_condition(obj, provisioning.ACCEPTED, True, "Accepted", "again")
    assert obj["status"]["conditions"][0]["lastTransitionTime"] == "2000-01-01T00:00:00Z" != first
    assert provisioning.has_condition(obj, provisioning.ACCEPTED)
    assert not provisioning.has_condition(obj, provisioning.PROVISIONED)
