"""CheckpointStore and assess() on a local directory and an fsspec memory filesystem."""

from __future__ import annotations

import datetime
import logging

import pytest

from airflow_gpupool.checkpoints import (
    CheckpointEventStatus,
    CheckpointManifest,
    CheckpointStore,
    CorruptCheckpointError,
    assess,
    manifest_bytes,
)


def test_lists_valid_checkpoints_oldest_first_and_newest(location) -> None:
    for step, loss in ((1, 2.0), (2, 1.5), (10, 0.5)):
        location.write(step, loss=loss)

    listing = CheckpointStore(location.url).scan()

    assert [c.step for c in listing.valid] == [1, 2, 10]
    assert listing.newest is not None and listing.newest.metrics == {"loss": 0.5}
    assert listing.newest.location == f"{location.url}/step-000010"
    assert listing.newest.time == datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    assert listing.complete is False and listing.skipped == ()


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        pytest.param(None, "incomplete: no manifest.json yet", id="no-manifest"),
        pytest.param(b"{not json", "manifest.json is not JSON", id="not-json"),
        pytest.param(
            {"step": 4, "time": "yesterday", "metrics": {}}, "time 'yesterday' is not ISO 8601", id="bad-time"
        ),
        pytest.param(
            {"step": 3, "time": "2026-01-01T00:00:00Z"},
            "manifest says step 3, the directory says 4",
            id="wrong-step",
        ),
        pytest.param(
            {"step": 4, "time": "2026-01-01T00:00:00Z", "metrics": [1]},
            "metrics [1] is not an object",
            id="bad-metrics",
        ),
    ],
)
def test_incomplete_or_corrupt_checkpoint_is_skipped_with_a_warning(
    location, caplog, manifest, reason
) -> None:
    location.write(3)
    location.write(4, manifest=manifest)

    with caplog.at_level(logging.WARNING, logger="airflow_gpupool.checkpoints.store"):
        listing = CheckpointStore(location.url).scan()

    assert listing.newest is not None and listing.newest.step == 3
    (skipped,) = listing.skipped
    assert skipped.step == 4 and skipped.reason.startswith(reason)
    assert f"Skipping checkpoint {location.url}/step-000004" in caplog.text


def test_completion_marker_and_missing_location(location) -> None:
    store = CheckpointStore(location.url + "/absent")
    assert store.scan().valid == () and store.newest() is None
    location.write(1)
    location.complete()
    assert CheckpointStore(location.url).scan().complete is True


def test_prune_keeps_the_newest_n_pinned_steps_and_in_flight_writes(location) -> None:
    for step in range(1, 8):
        location.write(step)
    location.write(0, manifest=None)  # a dead writer's leftover, older than the newest valid
    location.write(9, manifest=None)  # being written right now
    store = CheckpointStore(location.url)
    store.pin(2, "gp-retry")

    assert store.prune(3) == [0, 1, 3, 4]
    assert location.steps() == ["step-000002", "step-000005", "step-000006", "step-000007", "step-000009"]
    store.unpin("gp-retry")
    store.unpin("gp-retry")  # idempotent
    assert store.prune(3) == [2]
    with pytest.raises(ValueError, match="at least 1"):
        store.prune(0)


def test_manifest_round_trip_and_contract_writer() -> None:
    when = datetime.datetime(2026, 5, 1, 12, tzinfo=datetime.UTC)
    manifest = CheckpointManifest.parse(
        manifest_bytes(7, {"loss": 0.1}, when=when), location="memory://x/step-000007"
    )
    assert manifest == CheckpointManifest(7, when, {"loss": 0.1}, "memory://x/step-000007")
    assert CheckpointManifest.from_dict(manifest.to_dict()).to_dict() == manifest.to_dict()
    with pytest.raises(CorruptCheckpointError) as error:
        CheckpointManifest.parse(b"[]", location="here")
    assert (error.value.location, error.value.detail) == ("here", "manifest.json is not a JSON object")


def test_assess_progress_completion_stall(location) -> None:
    location.write(1, time="2026-01-01T00:00:00+00:00")
    listing = CheckpointStore(location.url).scan()
    t1 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC).timestamp()

    assert (
        assess(listing, last_step=-1, since=t1, now=t1, max_interval=60).status
        is CheckpointEventStatus.PROGRESS
    )
    assert assess(listing, last_step=1, since=t1, now=t1 + 59, max_interval=60).status is None
    stalled = assess(listing, last_step=1, since=t1, now=t1 + 61, max_interval=60)
    assert stalled.status is CheckpointEventStatus.STALLED and "newest: step 1" in stalled.message
    assert assess(listing, last_step=1, since=t1, now=t1 + 10_000, max_interval=None).status is None
    location.complete()
    done = assess(
        CheckpointStore(location.url).scan(), last_step=1, since=t1, now=t1 + 10_000, max_interval=60
    )
    assert done.status is CheckpointEventStatus.COMPLETED and done.message == "training complete at step 1"
