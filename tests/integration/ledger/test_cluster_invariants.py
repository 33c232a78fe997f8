"""The cluster's side of check_invariants: live pods of reservations on one GPU or MIG slice."""

from __future__ import annotations

from typing import Any

from airflow_gpupool.labels import RESERVATION_LABEL
from airflow_gpupool.ledger import Ledger, cluster_violations
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import FakeClock, node


def pod(name: str, rid: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "labels": {RESERVATION_LABEL: rid}},
        "status": {"phase": phase},
    }


def test_shared_fractions_are_fine_and_a_reused_mig_slice_is_not(ledger: Ledger, clock: FakeClock) -> None:
    ledger.upsert_nodes([node("n1", gpus=1), node("m1", gpus=1, mig={0: ["1g.10gb"]})])
    quarter = GpuRequest(gpus=0, gpu_milli=250, gpu_memory_mib=1024)
    a = ledger.reserve(quarter, "a", reservation_id="gp-a")
    b = ledger.reserve(quarter, "b", reservation_id="gp-b")
    assert a.grant is not None and b.grant is not None and a.grant.node == b.grant.node == "n1"
    mig = ledger.reserve(GpuRequest(mig_profile="1g.10gb"), "m", ttl=4, reservation_id="gp-mig")
    clock.advance(5)
    ledger.reap()  # unbound: the slice is freed though its pod may still run
    again = ledger.reserve(GpuRequest(mig_profile="1g.10gb"), "m2", reservation_id="gp-mig2")
    assert mig.grant is not None and again.grant is not None and again.grant.mig_slice == mig.grant.mig_slice

    pods = [
        pod("a", "gp-a"),
        pod("b", "gp-b"),
        pod("a-old", "gp-a", phase="Succeeded"),  # finished pods hold nothing
        pod("mig", "gp-mig"),
        pod("mig2", "gp-mig2"),
        pod("stranger", "not-in-the-ledger"),
    ]
    found = ledger.read(lambda conn: cluster_violations(conn, pods))

    assert found == [f"MIG slice m1/{mig.grant.mig_slice}: used by 2 live pods at once ['ml/mig', 'ml/mig2']"]
    assert ledger.read(lambda conn: cluster_violations(conn, pods[:3] + pods[5:])) == []
