"""LeasedPodTrigger: the pod trigger that also renews the task's lease."""

from __future__ import annotations

import datetime

from airflow_gpupool.triggers import LeasedPodTrigger


def test_leased_pod_trigger_round_trips_pod_and_lease_arguments() -> None:
    from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger

    pod_trigger = KubernetesPodTrigger(
        pod_name="train-x",
        pod_namespace="ml",
        trigger_start_time=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        poll_interval=3,
        base_container_name="base",
    )
    leased = LeasedPodTrigger.wrap(
        pod_trigger,
        reservation_id="gp-2",
        ledger_conn_id=None,
        lease_ttl=90.0,
        checkpoint_dir="s3://ckpt/train/run-1",
        checkpoint_conn_id="aws_ckpt",
        granted_node="gpu-a100-1",
        unschedulable_grace_seconds=12.5,
    )
    classpath, kwargs = leased.serialize()
    assert classpath == "airflow_gpupool.triggers.pod.LeasedPodTrigger"
    _, pod_kwargs = pod_trigger.serialize()
    assert kwargs == {
        **pod_kwargs,
        "reservation_id": "gp-2",
        "ledger_conn_id": None,
        "ledger_url": None,
        "lease_ttl": 90.0,
        "checkpoint_dir": "s3://ckpt/train/run-1",
        "checkpoint_conn_id": "aws_ckpt",
        "granted_node": "gpu-a100-1",
        "unschedulable_grace_seconds": 12.5,
    }
    assert LeasedPodTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_without_a_checkpoint_location_both_checkpoint_arguments_round_trip_as_none() -> None:
    from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger

    pod_trigger = KubernetesPodTrigger(
        pod_name="train-x",
        pod_namespace="ml",
        trigger_start_time=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        base_container_name="base",
    )
    _, kwargs = LeasedPodTrigger.wrap(pod_trigger, reservation_id="gp-3", lease_ttl=60.0).serialize()
    assert (kwargs["checkpoint_dir"], kwargs["checkpoint_conn_id"]) == (None, None)
    assert LeasedPodTrigger(**kwargs).serialize()[1] == kwargs
