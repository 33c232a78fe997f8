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
    leased = LeasedPodTrigger.wrap(pod_trigger, reservation_id="gp-2", ledger_conn_id=None, lease_ttl=90.0)
    classpath, kwargs = leased.serialize()
    assert classpath == "airflow_gpupool.triggers.pod.LeasedPodTrigger"
    _, pod_kwargs = pod_trigger.serialize()
    assert kwargs == {
        **pod_kwargs,
        "reservation_id": "gp-2",
        "ledger_conn_id": None,
        "ledger_url": None,
        "lease_ttl": 90.0,
    }
    assert LeasedPodTrigger(**kwargs).serialize() == (classpath, kwargs)
