"""LedgerSnapshot.to_dict: the one JSON form of a snapshot (``gpupool status --json``, the UI's API)."""

from __future__ import annotations

import json

from airflow_gpupool.ledger import Grant, LedgerSnapshot, NodeRecord, Reservation, ReservationState
from airflow_gpupool.placement.snapshot import ClusterSnapshot
from airflow_gpupool.resources import GpuRequest

GPU = {"node": "n1", "idx": 0, "uuid": "GPU-0", "model": "A100", "free_milli": 0, "partitioned": False}
GRANT = Grant("n1", "a100", (0,), ("GPU-0",), "A100", 1000, 81920, None, None, 10.0, 40.0)
REQUEST = GpuRequest(gpus=1)


def _snapshot() -> LedgerSnapshot:
    node = NodeRecord("n1", "a100", "healthy", {"zone": "z1"}, 8000, 65536, 7000, 64512, None, (GPU,))
    granted = Reservation("r1", "h1", ReservationState.GRANTED, REQUEST, 9.0, 99.0, GRANT)
    waiting = Reservation(
        "r2", "h2", ReservationState.WAITING, REQUEST, 11.0, 99.0, position=1, message="no fit"
    )
    return LedgerSnapshot(
        taken_at=12.5,
        cluster=ClusterSnapshot(()),
        nodes=(node,),
        grants=(granted,),
        queue=(waiting,),
        gpu_capacity_milli=1000,
        gpu_allocated_milli=1000,
        extra={"not": "exported"},
    )


def test_to_dict_is_primitives_in_a_fixed_shape() -> None:
    snapshot = _snapshot()
    out = snapshot.to_dict()
    assert out == {
        "taken_at": 12.5,
        "gpu_capacity_milli": 1000,
        "gpu_allocated_milli": 1000,
        "allocation": 1.0,
        "nodes": [
            {
                "name": "n1",
                "node_pool": "a100",
                "health": "healthy",
                "labels": {"zone": "z1"},
                "cpu_milli": 8000,
                "cpu_free": 7000,
                "memory_mib": 65536,
                "memory_free": 64512,
                "heartbeat_at": None,
                "health_source": "inventory",
                "health_reason": None,
                "heartbeat_age_s": None,
                "gpus": [{k: v for k, v in GPU.items() if k != "node"}],
            }
        ],
        "grants": [snapshot.grants[0].to_dict()],
        "external": [],
        "queue": [snapshot.queue[0].to_dict()],
        "orphaned": [],
        "leaks": [],
    }
    # Key order is part of the form: the UI's API serializes it as it is, without sorting.
    assert list(out) == [
        "taken_at",
        "gpu_capacity_milli",
        "gpu_allocated_milli",
        "allocation",
        "nodes",
        "grants",
        "external",
        "queue",
        "orphaned",
        "leaks",
    ]
    assert json.loads(json.dumps(out)) == out
