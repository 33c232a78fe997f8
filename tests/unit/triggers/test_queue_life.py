"""The queue life of a waiting request: kept by the trigger, written to the task log at grant."""

from __future__ import annotations

from airflow_gpupool.triggers.queue_life import QueueLife, describe_queue_life


def test_positions_are_kept_when_they_change_and_the_latest_reason() -> None:
    life = QueueLife(started=1000.0)
    life.saw(3, "no node fits 8 GPUs", at=1001.0)
    life.saw(3, None, at=1005.0)  # same position: not repeated, reason kept
    life.saw(1, "it fits n2 now but 1 earlier request(s) hold the queue", at=1030.0)
    assert life.to_dict(42.25) == {
        "waited_s": 42.25,
        "positions": [[1.0, 3], [30.0, 1]],
        "blocked": "it fits n2 now but 1 earlier request(s) hold the queue",
    }
    assert describe_queue_life(life.to_dict(42.25)) == (
        "waited 42.2s in the queue; positions: 3 at 1s -> 1 at 30s; "
        "blocked by: it fits n2 now but 1 earlier request(s) hold the queue"
    )


def test_a_long_wait_stays_one_short_line() -> None:
    life = QueueLife(started=0.0)
    for n in range(100, 0, -1):
        life.saw(n, None, at=float(100 - n))
    positions = life.to_dict(100.0)["positions"]
    assert len(positions) <= 12 and positions[0] == [0.0, 100] and positions[-1] == [99.0, 1]


def test_a_grant_without_a_wait_says_so() -> None:
    assert describe_queue_life(None) == "granted at once, without waiting"
