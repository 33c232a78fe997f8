"""pod_event: the one Event shape the gatekeeper and the reconciler leave on a pod."""

from __future__ import annotations

from airflow_gpupool.controller.admission import gatekeeper_event
from airflow_gpupool.controller.events import pod_event

POD = {"metadata": {"name": "train-0", "namespace": "ml", "uid": "u-1"}}


def test_pod_event_names_the_pod_and_stamps_both_times() -> None:
    event = pod_event(
        POD, kind="Warning", reason="Orphaned", message="why", component="me", now=0.0, suffix="me-0"
    )
    assert event == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "train-0.me-0"},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": "ml",
            "name": "train-0",
            "uid": "u-1",
        },
        "reason": "Orphaned",
        "message": "why",
        "type": "Warning",
        "source": {"component": "me"},
        "reportingComponent": "me",
        "firstTimestamp": "1970-01-01T00:00:00Z",
        "lastTimestamp": "1970-01-01T00:00:00Z",
        "count": 1,
    }


def test_a_pod_without_a_namespace_is_in_default() -> None:
    event = pod_event({}, kind="Normal", reason="R", message="m", component="c", now=0.0, suffix="s")
    assert event["involvedObject"]["namespace"] == "default"
    assert event["metadata"]["name"] == "None.s"


def test_the_gatekeeper_event_comes_from_the_gatekeeper() -> None:
    event = gatekeeper_event(POD, "Normal", "Admitted", "granted")
    assert event["source"] == {"component": "gpupool-gatekeeper"}
    assert (event["type"], event["reason"], event["message"]) == ("Normal", "Admitted", "granted")
    assert event["metadata"]["name"].startswith("train-0.gatekeeper-")
