"""A small, fully known GPU pool for the metrics and UI tests: every figure is derived by hand below.

Nodes (inventory):
    a100-1    pool train, 2 × A100, heartbeat 30 s before "now", healthy
    a100-mig  pool mig,   1 × A100 cut into two 3g.40gb MIG slices
    t4-1      pool infer, 1 × T4, quarantined, no heartbeat

Live grants (after the history below):
    train   vision/training  1 whole A100 on a100-1      1000 milli
    embed   nlp/batch        0.25 of the other A100       250 milli
    mig     nlp/batch        one 3g.40gb slice            round(3 * 1000 / 7) = 429 milli

Queue: ``wide`` (2 GPUs, priority 5, waiting 120 s) and ``wide2`` (2 GPUs, priority 0, 20 s).

Ended: 1 released, 1 expired (lease), 1 timed out, 1 cancelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_gpupool.ledger import Ledger
from airflow_gpupool.resources import GpuRequest, WorkloadClass
from tests.ledger_fixtures import FakeClock, node

T0 = 1_800_000_000.0
TRAIN_HOLDER = "train_dag/fit/manual__2027-01-15T10:00:00+00:00/map--1/try-1@worker-1"
EMBED_HOLDER = "embed_dag/embed/scheduled__2027-01-15T00:00:00+00:00/map-3/try-2@worker-2"


@dataclass
class Pool:
    """The ledger and its clock, and the reservation ids the tests look for."""

    ledger: Ledger
    clock: FakeClock
    ids: dict[str, str]


def build_pool(url: str) -> Pool:
    """Create the ledger described in the module docstring at ``url``."""
    clock = FakeClock(T0)
    ledger = Ledger.create(url, clock=clock, policy="bestfit", max_overtakes=8)
    ledger.upsert_nodes(
        [
            node("a100-1", gpus=2, model="A100", pool="train"),
            node("a100-mig", gpus=1, model="A100", pool="mig", mig={0: ["3g.40gb", "3g.40gb"]}),
            node("t4-1", gpus=1, model="T4", memory_mib=16384, pool="infer"),
        ]
    )
    ids: dict[str, str] = {}

    def reserve(key: str, holder: str, request: GpuRequest, **kw: float) -> None:
        ids[key] = ledger.reserve(request, holder, reservation_id=f"r-{key}", **kw).id

    # History first: released, expired (lease not renewed), timed out, cancelled.
    reserve(
        "released",
        "adhoc-notebook@laptop",
        GpuRequest(gpu_milli=500, gpu_models=frozenset({"T4"}), team="ops"),
    )
    ledger.release(ids["released"])
    reserve(
        "expired", "lost/task/run/map--1/try-1@gone", GpuRequest(gpus=1, gpu_models=frozenset({"T4"})), ttl=10
    )
    reserve(
        "timed_out",
        "big/task/run/map--1/try-1@w",
        GpuRequest(gpus=1, gpu_models=frozenset({"T4"})),
        timeout=5,
    )
    reserve("cancelled", "cancel/task/run/map--1/try-1@w", GpuRequest(gpus=1, gpu_models=frozenset({"T4"})))
    ledger.release(ids["cancelled"])
    clock.advance(20)
    ledger.reap()
    ledger.set_health("t4-1", "quarantined")

    # Live state.
    reserve(
        "train",
        TRAIN_HOLDER,
        GpuRequest(
            gpus=1, gpu_models=frozenset({"A100"}), workload_class=WorkloadClass.TRAINING, team="vision"
        ),
        ttl=3600,
    )
    reserve("embed", EMBED_HOLDER, GpuRequest(gpu_milli=250, node_labels=(), team="nlp"), ttl=3600)
    reserve("mig", "mig/task/run/map--1/try-1@w", GpuRequest(mig_profile="3g.40gb", team="nlp"), ttl=3600)
    reserve(
        "wide", "wide/task/run/map--1/try-1@w", GpuRequest(gpus=2, priority=5, team="vision"), timeout=3600
    )
    clock.advance(100)
    reserve("wide2", "wide2/task/run/map--1/try-1@w", GpuRequest(gpus=2, team="vision"), timeout=3600)
    ledger.heartbeat("a100-1", at=clock.now - 10)
    clock.advance(20)
    return Pool(ledger, clock, ids)
