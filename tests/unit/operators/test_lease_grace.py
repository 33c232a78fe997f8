"""A preemption victim's pod is deleted with the grace left when it is deleted, not when the loss was seen.

The deferred path sees the loss in the triggerer; the task resumes in a worker later (a free slot,
a loaded scheduler) and deletes the pod again, waiting until it is gone. The grace it gives is
counted from the ledger's deadline at that moment.
"""

from __future__ import annotations

from unittest import mock

import pytest

from airflow_gpupool.exceptions import GrantPreemptedError, LeaseLostError
from airflow_gpupool.hooks.gpupool import GpuPoolHook
from airflow_gpupool.operators import GpuPodOperator
from airflow_gpupool.operators.pod import pod_lease
from airflow_gpupool.triggers.lease import LeaseWatch, lease_lost_event, lost_from_event

DEADLINE = 1_000_120.0


def preempted_event() -> dict[str, object]:
    """The lease-lost event of a victim refused with 19 s of its grace left."""
    watch = LeaseWatch("gp-victim", ttl=30.0)
    lost = watch.failed(GrantPreemptedError("gp-victim", DEADLINE, 19.0, "gp-urgent"))
    assert lost is not None
    return lease_lost_event(lost, "ml", "train-x")


def test_the_event_carries_the_deadline_and_the_grace_is_counted_from_it() -> None:
    lost = lost_from_event(preempted_event(), "train-x")
    assert (lost.preempted, lost.grace_seconds, lost.deadline) == (True, 19.0, DEADLINE)
    assert lost.grace_left(DEADLINE - 7.5) == 7.5
    assert lost.grace_left(DEADLINE + 3) == 0.0  # past the deadline: none left
    assert LeaseLostError.of("gp-x", "released", grace_seconds=0.0).grace_left(DEADLINE) == 0.0


@pytest.mark.parametrize(("now", "grace"), [(DEADLINE - 7.5, 7.5), (DEADLINE + 2, 0.0)])
def test_the_resumed_task_deletes_its_pod_with_the_grace_left_now(now: float, grace: float) -> None:
    op = GpuPodOperator(task_id="train", image="train:1", gpus=1)
    op.__dict__["client"] = client = mock.sentinel.core_v1_api  # KPO's cached client: the boundary
    with (
        mock.patch.object(GpuPoolHook, "now", autospec=True, return_value=now),
        mock.patch.object(pod_lease, "delete_pod", autospec=True) as delete_pod,
        pytest.raises(LeaseLostError) as raised,
    ):
        op._lease_lost(preempted_event())
    assert raised.value.preempted
    delete_pod.assert_called_once_with(
        client, "ml", "train-x", why=raised.value.classification.reason, log=op.log, grace_seconds=grace
    )
