"""One policy object shared by threads (one ledger per process: its hooks' and triggers' threads).

A policy keeps a table of the last snapshot it saw and updates it in place on the next call; two
threads placing on different snapshots at once once left a trigger's ``explain`` with a table of
the wrong size (``IndexError`` in ``NodeTable._fill``) in the queue bench's triggerer.
"""

from __future__ import annotations

import threading

import pytest

from airflow_gpupool.placement import ClusterSnapshot, GpuState, NodeState, get_policy
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest


def _snapshot(size: int, free: int) -> ClusterSnapshot:
    gpus = tuple(
        GpuState(i, "A100", 81920, 1000 if i < free else 0, 81920 if i < free else 0) for i in range(8)
    )
    return ClusterSnapshot(tuple(NodeState(f"n{i:03d}", 64000, 262144, gpus) for i in range(size)))


@pytest.mark.parametrize("name", ["gpupool", "bestfit", "fgd"])
def test_threads_sharing_a_policy_each_get_the_answer_for_their_own_snapshot(name: str) -> None:
    policy = get_policy(name)
    # Each thread alternates between snapshots of different sizes, so the shared table is resized
    # under the others; each answer is checked against the snapshot it was asked about.
    cases = [(_snapshot(1, 2), 2), (_snapshot(40, 1), 1), (_snapshot(7, 4), 4)]
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def place(offset: int) -> None:
        start.wait()
        try:
            for i in range(150):
                snapshot, free = cases[(i + offset) % len(cases)]
                verdict = policy.place(snapshot, GpuRequest(gpus=free))
                assert isinstance(verdict, Assignment) and len(verdict.gpu_indices) == free
                assert verdict.node in {n.name for n in snapshot.nodes}
        except BaseException as e:  # a thread's failure is reported by the test itself
            errors.append(e)

    threads = [threading.Thread(target=place, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
