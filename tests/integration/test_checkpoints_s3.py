"""Checkpoints on S3: the store, the trigger and a resumed training against moto's real S3 server.

Everything reaches the bucket through ObjectStoragePath and the ``gpupool_s3`` Airflow
connection (the Amazon provider's s3fs filesystem); the objects are checked with a separate
boto3 client, so a listing cache in fsspec cannot hide a missing write.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from airflow_gpupool.checkpoints import CheckpointEventStatus, CheckpointStore, manifest_bytes
from airflow_gpupool.checkpoints.store import request_checkpoint
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.testing.pods.checkpoints import save_complete, write_step_url
from airflow_gpupool.triggers.checkpoint import CheckpointTrigger
from tests.s3_fixtures import ACCESS_KEY, REGION, SECRET_KEY, MotoS3


@pytest.fixture
def s3_root(moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh location in the bucket, reachable only through the connection (no ``AWS_*`` variables)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name)
    return moto_s3.url("tests", uuid.uuid4().hex)


def s3_keys(moto_s3: MotoS3, url: str) -> list[str]:
    """List the object keys under ``url`` with boto3 (relative to it), sorted."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=moto_s3.endpoint_url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
    )
    prefix = url.removeprefix(f"s3://{moto_s3.bucket}/").rstrip("/") + "/"
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=moto_s3.bucket, Prefix=prefix)
    return sorted(obj["Key"].removeprefix(prefix) for page in pages for obj in page.get("Contents", []))


def put(store: CheckpointStore, relative: str, body: bytes) -> None:
    store.fs.pipe_file(f"{store.root}/{relative}", body)


def test_store_reads_manifests_and_skips_incomplete_and_corrupt_steps(moto_s3: MotoS3, s3_root: str) -> None:
    store = CheckpointStore(s3_root, conn_id=moto_s3.conn_id)
    put(store, "step-000001/model.bin", b"w1")
    put(store, "step-000001/manifest.json", manifest_bytes(1, {"loss": 0.9}))
    put(store, "step-000002/model.bin", b"w2")
    put(store, "step-000002/manifest.json", manifest_bytes(2, {"loss": 0.5}))
    put(store, "step-000003/model.bin", b"still uploading")
    put(store, "step-000004/manifest.json", b"{not json")

    listing = store.scan()

    assert [(c.step, c.metrics, c.location) for c in listing.valid] == [
        (1, {"loss": 0.9}, f"{s3_root}/step-000001"),
        (2, {"loss": 0.5}, f"{s3_root}/step-000002"),
    ]
    assert [(s.step, s.reason.split(":")[0]) for s in listing.skipped] == [
        (3, "incomplete"),
        (4, "manifest.json is not JSON (Expecting property name enclosed in double quotes"),
    ]
    assert not listing.complete
    assert store.step_url(2) == f"{s3_root}/step-000002"
    assert s3_keys(moto_s3, s3_root) == [
        "step-000001/manifest.json",
        "step-000001/model.bin",
        "step-000002/manifest.json",
        "step-000002/model.bin",
        "step-000003/model.bin",
        "step-000004/manifest.json",
    ]


def test_store_accepts_an_object_storage_path(moto_s3: MotoS3, s3_root: str) -> None:
    from airflow.sdk import ObjectStoragePath

    write_url = CheckpointStore(s3_root, conn_id=moto_s3.conn_id)
    put(write_url, "step-000007/manifest.json", manifest_bytes(7))

    newest = CheckpointStore(ObjectStoragePath(s3_root, conn_id=moto_s3.conn_id)).newest()

    assert newest is not None and (newest.step, newest.location) == (7, f"{s3_root}/step-000007")


def test_pins_and_retention_on_s3(moto_s3: MotoS3, s3_root: str) -> None:
    store = CheckpointStore(s3_root, conn_id=moto_s3.conn_id)
    for step in range(1, 8):
        put(store, f"step-{step:06d}/manifest.json", manifest_bytes(step))
    store.pin(2, "gp-retry")

    assert store.pinned_steps() == {2}
    assert store.prune(3) == [1, 3, 4]
    assert s3_keys(moto_s3, s3_root) == [
        ".gpupool-pins/gp-retry.json",
        "step-000002/manifest.json",
        "step-000005/manifest.json",
        "step-000006/manifest.json",
        "step-000007/manifest.json",
    ]
    store.unpin("gp-retry")
    assert store.prune(3) == [2]
    assert s3_keys(moto_s3, s3_root) == [f"step-{s:06d}/manifest.json" for s in (5, 6, 7)]


def test_checkpoint_now_flag_is_written_once(moto_s3: MotoS3, s3_root: str) -> None:
    store = CheckpointStore(s3_root, conn_id=moto_s3.conn_id)

    assert request_checkpoint(store, "gp-1", ["xid 31"], at=100.0) is True
    assert request_checkpoint(store, "gp-2", ["heat"], at=200.0) is False

    body = json.loads(store.fs.cat_file(f"{store.root}/CHECKPOINT_NOW"))
    assert body == {"reservation_id": "gp-1", "reasons": ["xid 31"], "requested_at": 100.0}


async def first_event(trigger: CheckpointTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AssertionError("the trigger ended without an event")


def test_sensor_trigger_sees_progress_then_completion_on_s3(moto_s3: MotoS3, s3_root: str) -> None:
    def trigger(last_step: int) -> CheckpointTrigger:
        return CheckpointTrigger(
            checkpoint_dir=s3_root,
            conn_id=moto_s3.conn_id,
            last_step=last_step,
            since=0.0,
            max_interval=None,
            poll_interval=0.05,
        )

    store = CheckpointStore(s3_root, conn_id=moto_s3.conn_id)
    put(store, "step-000001/manifest.json", manifest_bytes(1, {"loss": 0.7}))
    progress = asyncio.run(first_event(trigger(-1)))
    put(store, "step-000002/manifest.json", manifest_bytes(2))
    put(store, "COMPLETE", b'{"step": 2}')
    completed = asyncio.run(first_event(trigger(1)))

    assert (progress["status"], progress["step"]) == (CheckpointEventStatus.PROGRESS.value, 1)
    assert progress["manifest"]["metrics"] == {"loss": 0.7}
    assert progress["manifest"]["location"] == f"{s3_root}/step-000001"
    assert (completed["status"], completed["step"]) == (CheckpointEventStatus.COMPLETED.value, 2)


def test_emulated_training_writes_through_fsspec(moto_s3: MotoS3) -> None:
    """The emulator's kubelet writes with plain fsspec and the ``AWS_*`` variables, as a container."""
    root = moto_s3.url("kubelet", uuid.uuid4().hex)

    assert write_step_url(root, 1) == f"{root}/step-000001"
    save_complete(root, 1)

    assert s3_keys(moto_s3, root) == ["COMPLETE", "step-000001/manifest.json", "step-000001/model.bin"]


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}


def test_failed_training_resumes_from_its_s3_checkpoint(
    moto_s3: MotoS3, run_dag: Any, k8s: Any, gpu_ledger: Ledger
) -> None:
    dag_run = run_dag("ckpt_s3_resume")

    train, watch = (
        next(t for t in dag_run.get_task_instances() if t.task_id == i) for i in ("train", "watch")
    )
    assert (str(train.state), train.try_number, str(watch.state)) == ("success", 2, "success")
    root = moto_s3.url("e2e", "ckpt_s3_resume", dag_run.run_id)
    first, retry = k8s.created_pods()
    assert env_of(first)["GPUPOOL_CHECKPOINT_DIR"] == root and "GPUPOOL_RESUME_FROM" not in env_of(first)
    assert env_of(retry)["GPUPOOL_RESUME_FROM"] == f"{root}/step-000003"
    # The retry wrote steps 4 and 5 and the marker; retention kept the newest two, the pin is gone.
    assert s3_keys(moto_s3, root) == [
        "COMPLETE",
        "step-000004/manifest.json",
        "step-000004/model.bin",
        "step-000005/manifest.json",
        "step-000005/model.bin",
    ]
    assert watch.xcom_pull(task_ids="watch", key="checkpoint_step") == 5
    assert gpu_ledger.snapshot().grants == () and gpu_ledger.check_invariants() == []
