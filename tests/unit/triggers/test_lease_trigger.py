"""LeasedPodTrigger when the lease is lost: it yields a lease-lost event instead of waiting for the pod.

A real SQLite ledger; the pod watch of the parent trigger is replaced by one that never ends
(a pod still running), the one boundary faked here."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from airflow_gpupool.ledger import Ledger
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.triggers import LeasedPodTrigger
from airflow_gpupool.triggers.lease import LEASE_LOST_STATUS
from airflow_gpupool.triggers.leased import cancel_quietly
from tests.ledger_fixtures import node


def trigger_for(url: str, rid: str) -> LeasedPodTrigger:
    return LeasedPodTrigger(
        pod_name="train-x",
        pod_namespace="ml",
        trigger_start_time=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        base_container_name="base",
        reservation_id=rid,
        ledger_conn_id=None,
        ledger_url=url,
        lease_ttl=30.0,
    )


async def pod_still_running(self: Any) -> AsyncIterator[Any]:
    await asyncio.Event().wait()
    yield None  # pragma: no cover (never reached)


def test_a_released_grant_deletes_the_pod_and_yields_a_lease_lost_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook
    from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger

    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger = Ledger.create(url)
    ledger.upsert_nodes([node("n1", gpus=2)])
    rid = ledger.reserve(GpuRequest(gpus=1), "worker-1", reservation_id="gp-t", ttl=30).id
    ledger.release(rid, reason="taken back")
    monkeypatch.setattr(KubernetesPodTrigger, "run", pod_still_running)
    # The Kubernetes API is the boundary: the trigger deletes the pod itself, at once.
    delete_pod = mock.create_autospec(AsyncKubernetesHook.delete_pod)
    monkeypatch.setattr(AsyncKubernetesHook, "delete_pod", delete_pod)

    async def first_event() -> Any:
        events = trigger_for(url, rid).run()
        try:
            return await asyncio.wait_for(events.__anext__(), timeout=30)
        finally:
            await events.aclose()

    event = asyncio.run(first_event())
    ledger.close()

    assert event.payload["status"] == LEASE_LOST_STATUS
    assert (event.payload["namespace"], event.payload["name"], event.payload["reservation_id"]) == (
        "ml",
        "train-x",
        rid,
    )
    assert "it is released" in event.payload["why"]
    delete_pod.assert_awaited_once_with(mock.ANY, "train-x", "ml", grace_period_seconds=0)


def test_the_pod_watch_seeing_the_deletion_first_still_yields_the_lease_lost_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook
    from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger
    from airflow.triggers.base import TriggerEvent

    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger = Ledger.create(url)
    ledger.upsert_nodes([node("n1", gpus=2)])
    rid = ledger.reserve(GpuRequest(gpus=1), "worker-1", reservation_id="gp-t", ttl=30).id
    ledger.release(rid, reason="taken back")
    deleted = asyncio.Event()
    finish_delete = asyncio.Event()

    async def delete_pod(self: Any, name: str, namespace: str, grace_period_seconds: int) -> None:
        deleted.set()
        await finish_delete.wait()  # the API answers the delete only after the watch saw the pod gone

    async def pod_gone_once_deleted(self: Any) -> AsyncIterator[Any]:
        await deleted.wait()
        finish_delete.set()
        yield TriggerEvent({"status": "error", "message": 'pods "train-x" not found'})

    monkeypatch.setattr(KubernetesPodTrigger, "run", pod_gone_once_deleted)
    monkeypatch.setattr(AsyncKubernetesHook, "delete_pod", delete_pod)

    async def events() -> list[Any]:
        return [e async for e in trigger_for(url, rid).run()]

    (event,) = asyncio.run(asyncio.wait_for(events(), timeout=30))
    ledger.close()

    assert event.payload["status"] == LEASE_LOST_STATUS and event.payload["reservation_id"] == rid
    assert "it is released" in event.payload["why"]


def test_a_grant_released_after_its_pod_ended_leaves_the_pod_and_reports_its_own_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reconcile released the grant of the finished pod before the pod watch's next poll saw it
    # end: no loss, no deletion; the pod's own event (a crash here) is what the operator gets.
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook
    from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger
    from airflow.triggers.base import TriggerEvent
    from kubernetes.client import V1Pod, V1PodStatus

    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger = Ledger.create(url)
    ledger.upsert_nodes([node("n1", gpus=2)])
    rid = ledger.reserve(GpuRequest(gpus=1), "worker-1", reservation_id="gp-t", ttl=30).id
    ledger.release(rid, reason="reconcile: pod ml/train-x finished (Failed: application_error (Error))")
    read = asyncio.Event()

    async def get_pod(self: Any, name: str, namespace: str) -> V1Pod:
        read.set()
        return V1Pod(status=V1PodStatus(phase="Failed"))

    async def pod_ends_at_the_next_poll(self: Any) -> AsyncIterator[Any]:
        await read.wait()  # the renewer looked at the pod first
        yield TriggerEvent({"status": "failed", "name": "train-x", "namespace": "ml", "message": "exit 1"})

    monkeypatch.setattr(KubernetesPodTrigger, "run", pod_ends_at_the_next_poll)
    monkeypatch.setattr(AsyncKubernetesHook, "get_pod", get_pod)
    delete_pod = mock.create_autospec(AsyncKubernetesHook.delete_pod)
    monkeypatch.setattr(AsyncKubernetesHook, "delete_pod", delete_pod)

    async def events() -> list[Any]:
        return [e async for e in trigger_for(url, rid).run()]

    (event,) = asyncio.run(asyncio.wait_for(events(), timeout=30))
    ledger.close()

    assert event.payload == {
        "status": "failed",
        "name": "train-x",
        "namespace": "ml",
        "message": "exit 1",
        "reservation_id": rid,
    }
    delete_pod.assert_not_awaited()


def test_each_renewal_reports_the_newest_valid_checkpoint_to_the_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger

    from airflow_gpupool.testing.pods.checkpoints import write_step

    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger = Ledger.create(url)
    ledger.upsert_nodes([node("n1", gpus=2)])
    rid = ledger.reserve(GpuRequest(gpus=1, preemptible=True), "worker-1", reservation_id="gp-c", ttl=30).id
    root = tmp_path / "ckpt"
    written = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
    write_step(root, 1, now=written - datetime.timedelta(minutes=5))
    write_step(root, 2, now=written)
    (root / "step-000003").mkdir()  # being written: no manifest yet, not a valid checkpoint
    monkeypatch.setattr(KubernetesPodTrigger, "run", pod_still_running)
    trigger = LeasedPodTrigger(**{**trigger_for(url, rid).serialize()[1], "checkpoint_dir": str(root)})

    async def reported() -> float | None:
        events = trigger.run()
        watching = asyncio.ensure_future(events.__anext__())
        try:
            for _ in range(600):  # the first renewal comes at once; read until it has reported
                if (at := ledger.get(rid).checkpoint_at) is not None:
                    return at
                await asyncio.sleep(0.05)
            return None
        finally:
            await cancel_quietly(watching)
            await events.aclose()

    at = asyncio.run(reported())
    reservation = ledger.get(rid)
    ledger.close()

    assert at == written.timestamp()
    assert reservation.state.holds and reservation.grant is not None


async def _lost_first_when(following_ends: BaseException, renewer_after_s: float | None) -> Any:
    """Run ``_lost_first`` with a wrapped trigger that fails at once and a renewer that finds the
    lease lost after ``renewer_after_s`` (None: never)."""
    from airflow_gpupool.triggers.leased import LeasedTrigger

    async def follow() -> Any:
        raise following_ends

    async def renew() -> dict[str, Any]:
        if renewer_after_s is None:
            await asyncio.Event().wait()
        await asyncio.sleep(renewer_after_s or 0)
        return {"status": LEASE_LOST_STATUS}

    following, renewer = asyncio.ensure_future(follow()), asyncio.create_task(renew())
    try:
        return await LeasedTrigger._lost_first(following, renewer)
    finally:
        await cancel_quietly(renewer)


def test_a_workload_gone_because_the_lease_was_lost_reports_the_lost_lease() -> None:
    # The renewer deletes the Job before it returns; the Job trigger polling it may see a 404 first
    # (CI, stop 25): the task must hear of the lost lease, and release the gang, not of the 404.
    event = asyncio.run(_lost_first_when(RuntimeError("404 Not Found"), renewer_after_s=0.05))
    assert event == {"status": LEASE_LOST_STATUS}


def test_a_workload_that_fails_while_the_lease_holds_reports_its_own_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("airflow_gpupool.triggers.leased._WORKLOAD_DELETED_S", 0.05)
    assert asyncio.run(_lost_first_when(RuntimeError("500"), renewer_after_s=None)) is None
    # A wrapped trigger that runs out of events has not failed: no wait for the renewer.
    assert asyncio.run(_lost_first_when(StopAsyncIteration(), renewer_after_s=None)) is None
