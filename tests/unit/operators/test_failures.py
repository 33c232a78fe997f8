"""Failure classification from a pod's final status, events and log tail."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_gpupool.exceptions import ReservationTimeoutError
from airflow_gpupool.operators.failures import (
    ApplicationError,
    Classification,
    FailureClass,
    ImagePullError,
    OutOfMemoryError,
    UnknownPodFailureError,
    classify,
    error_for,
)


def pod(
    *,
    phase: str = "Failed",
    reason: str | None = None,
    terminated: dict | None = None,
    waiting: str | None = None,
) -> dict[str, Any]:
    state: dict[str, Any] = {}
    if terminated is not None:
        state["terminated"] = terminated
    if waiting is not None:
        state["waiting"] = {"reason": waiting}
    status: dict[str, Any] = {"phase": phase, "containerStatuses": [{"name": "base", "state": state}]}
    if reason:
        status["reason"] = reason
    return {"metadata": {"name": "train-abc"}, "status": status}


CASES = [
    (
        "oom-killed",
        pod(terminated={"reason": "OOMKilled", "exitCode": 137}),
        [],
        "",
        FailureClass.OUT_OF_MEMORY,
        137,
    ),
    (
        "cuda-oom-in-log",
        pod(terminated={"reason": "Error", "exitCode": 1}),
        [],
        "step 9\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        FailureClass.OUT_OF_MEMORY,
        1,
    ),
    (
        "evicted",
        pod(reason="Evicted", terminated={"exitCode": 137}),
        [{"reason": "Evicted"}],
        "",
        FailureClass.EVICTED,
        137,
    ),
    (
        "drained-through-the-eviction-api",  # Karpenter's or a spot interruption handler's drain
        {
            **pod(terminated={"exitCode": 143}),
            "status": {
                **pod()["status"],
                "conditions": [
                    {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
                ],
            },
        },
        [],
        "",
        FailureClass.EVICTED,
        None,
    ),
    (
        "preempted-condition",
        {
            **pod(terminated={"exitCode": 143}),
            "status": {
                **pod()["status"],
                "conditions": [
                    {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
                ],
            },
        },
        [],
        "",
        FailureClass.PREEMPTED,
        None,
    ),
    ("node-lost", pod(reason="NodeLost"), [], "", FailureClass.NODE_LOST, None),
    ("image-pull", pod(phase="Pending", waiting="ImagePullBackOff"), [], "", FailureClass.IMAGE_PULL, None),
    (
        "image-pull-event",
        pod(phase="Pending"),
        [{"reason": "ErrImagePull"}],
        "",
        FailureClass.IMAGE_PULL,
        None,
    ),
    ("deadline", pod(reason="DeadlineExceeded"), [], "", FailureClass.DEADLINE_EXCEEDED, None),
    (
        "exit-code",
        pod(terminated={"reason": "Error", "exitCode": 3}),
        [],
        "ValueError",
        FailureClass.APPLICATION_ERROR,
        3,
    ),
    ("nothing-known", pod(phase="Running"), [], "", FailureClass.UNKNOWN, None),
    (
        "xid-in-the-log",
        pod(terminated={"reason": "Error", "exitCode": 1}),
        [],
        "step 3\nNVRM: Xid (PCI:0000:3b:00): 79, pid=42, GPU has fallen off the bus.",
        FailureClass.GPU_FAULT,
        1,
    ),
    (
        "ecc-beats-the-oom-it-caused",
        pod(terminated={"reason": "Error", "exitCode": 1}),
        [],
        "CUDA error: uncorrectable ECC error encountered\ntorch.OutOfMemoryError: CUDA out of memory",
        FailureClass.GPU_FAULT,
        1,
    ),
]


@pytest.mark.parametrize(
    ("name", "the_pod", "events", "tail", "expected", "exit_code"), CASES, ids=[c[0] for c in CASES]
)
def test_classify(name, the_pod, events, tail, expected, exit_code) -> None:
    result = classify(the_pod, events, tail)

    assert result.failure_class is expected
    assert result.exit_code == exit_code
    assert result.pod_name == "train-abc"


def test_reservation_timeout_and_no_pod() -> None:
    timeout = ReservationTimeoutError("gp-1", 60, ["gpu-a: full"])
    assert classify(None, error=timeout).failure_class is FailureClass.RESERVATION_TIMEOUT
    assert classify(None, error=RuntimeError("x")).failure_class is FailureClass.UNKNOWN


def test_typed_exceptions_carry_class_pod_exit_code_and_checkpoint() -> None:
    oom = error_for(
        Classification(FailureClass.OUT_OF_MEMORY, "OOMKilled", 137, "train-abc"),
        last_checkpoint=3,
        log_tail="t",
    )

    assert isinstance(oom, OutOfMemoryError)
    assert (oom.failure_class, oom.pod_name, oom.exit_code, oom.last_checkpoint, oom.log_tail) == (
        FailureClass.OUT_OF_MEMORY,
        "train-abc",
        137,
        3,
        "t",
    )
    assert (
        str(oom) == "pod train-abc failed: out_of_memory (OOMKilled, exit code 137, last checkpoint step 3)"
    )
    assert isinstance(error_for(Classification(FailureClass.IMAGE_PULL, "ErrImagePull")), ImagePullError)
    assert isinstance(error_for(Classification(FailureClass.APPLICATION_ERROR, "Error", 1)), ApplicationError)
    assert isinstance(error_for(Classification(FailureClass.UNKNOWN, "?")), UnknownPodFailureError)
