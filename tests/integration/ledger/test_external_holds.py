"""External holds on SQLite and PostgreSQL: pods this project did not make, counted by the ledger."""

from __future__ import annotations

import logging

import pytest

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.pod_gpus import ExternalPod, GpuUse
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node

EXTERNAL = ReservationState.EXTERNAL


def pod(name: str, node_name: str = "n1", uid: str | None = None, **use: object) -> ExternalPod:
    return ExternalPod("ml", name, uid or f"uid-{name}", node_name, GpuUse(**use))  # type: ignore[arg-type]


def held_gpus(ledger: Ledger) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in ledger.external_holds():
        assert r.grant is not None
        out.setdefault(r.holder, []).extend(r.grant.gpu_indices)
    return out


def test_a_foreign_pod_holds_the_lowest_free_gpus_and_no_grant_lands_on_them(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    mine = ledger.reserve(GpuRequest(gpus=1), "h", reservation_id="gp-1")
    assert mine.grant is not None and mine.grant.gpu_indices == (0,)

    done = ledger.sync_external([pod("notebook", whole=2)])

    assert done.counted == ("ml/notebook",)
    assert held_gpus(ledger) == {"external:ml/notebook": [1, 2]}
    assert ledger.check_invariants() == []
    grant = ledger.reserve(GpuRequest(gpus=1), "h2").grant
    assert grant is not None and grant.gpu_indices == (3,)
    assert ledger.reserve(GpuRequest(gpus=1), "h3").state is ReservationState.WAITING


def test_a_pod_gone_gives_its_gpus_back_and_serves_the_queue(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    ledger.sync_external([pod("infer", whole=2)])
    waiting = ledger.reserve(GpuRequest(gpus=2), "h", timeout=600)
    assert waiting.state is ReservationState.WAITING

    done = ledger.sync_external([], gone=["ml/infer"])

    assert done.released == ("ml/infer",)
    assert ledger.get(waiting.id).state is ReservationState.GRANTED
    assert ledger.external_holds() == []
    assert ledger.check_invariants() == []


def test_a_relist_ends_the_holds_of_pods_it_no_longer_finds_and_keeps_the_rest(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    ledger.sync_external([pod("a", whole=1), pod("b", whole=1)])

    done = ledger.sync_external([pod("b", whole=1)], complete=True)

    assert done.released == ("ml/a",) and done.kept == 1 and done.counted == ()
    assert held_gpus(ledger) == {"external:ml/b": [1]}


def test_a_pod_bound_to_a_grant_is_the_ledgers_already(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    granted = ledger.reserve(GpuRequest(gpus=1), "h", reservation_id="gp-1")
    ledger.bind(granted.id, namespace="ml", name="train", uid="uid-train")
    labelled = ExternalPod("ml", "job-x", "uid-x", "n1", GpuUse(whole=1), reservation_id="gp-1")

    done = ledger.sync_external([pod("train", whole=1), labelled])

    assert done.ours == ("ml/train", "ml/job-x") and done.counted == ()
    assert ledger.external_holds() == []


def test_a_replaced_pod_of_the_same_name_is_counted_again(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    ledger.sync_external([pod("a", uid="u1", whole=1)])
    done = ledger.sync_external([pod("a", uid="u2", whole=1)])
    assert done.counted == ("ml/a",)
    holds = ledger.external_holds()
    assert [r.grant.pod_uid for r in holds if r.grant] == ["u2"]
    assert ledger.check_invariants() == []


def test_mig_slices_and_shares_are_held_as_the_pod_asks(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2, mig={0: ["3g.40gb", "3g.40gb"]})])
    ledger.sync_external(
        [
            pod("mig", **{"mig": (("3g.40gb", 1),)}),
            pod("hami", shared=1, share_milli=300, share_memory_mib=8000),
        ]
    )
    holds = {r.holder: r.grant for r in ledger.external_holds()}
    mig, hami = holds["external:ml/mig"], holds["external:ml/hami"]
    assert mig is not None and mig.mig_slice == "n1-g0-m0"
    assert hami is not None and (hami.gpu_indices, hami.milli_per_gpu, hami.gpu_memory_mib) == (
        (1,),
        300,
        8000,
    )
    assert ledger.check_invariants() == []


def test_an_unreadable_pod_holds_every_free_gpu_of_its_node_and_says_why(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    ledger.upsert_nodes([node("n1", gpus=3)])
    ledger.reserve(GpuRequest(gpus=1), "h")
    with caplog.at_level(logging.WARNING):
        done = ledger.sync_external([pod("odd", unreadable="nvidia.com/gpu: 'two' is not a quantity")])
    assert done.short == ("ml/odd",)
    assert held_gpus(ledger) == {"external:ml/odd": [1, 2]}
    assert "ml/odd" in caplog.text and "'two' is not a quantity" in caplog.text
    assert ledger.check_invariants() == []


def test_what_a_grant_holds_is_not_held_twice_and_a_relist_takes_it_once_freed(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    granted = ledger.reserve(GpuRequest(gpus=1), "h")
    done = ledger.sync_external([pod("late", whole=1)])
    assert done.short == ("ml/late",)
    assert held_gpus(ledger) == {"external:ml/late": []}
    assert ledger.check_invariants() == []

    ledger.release(granted.id, reason="pod never started: the GPU was taken")
    again = ledger.sync_external([pod("late", whole=1)], complete=True)

    assert again.counted == ("ml/late",) and again.short == ()
    assert held_gpus(ledger) == {"external:ml/late": [0]}


def test_a_pod_on_a_node_the_ledger_does_not_keep_is_reported_not_held(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    done = ledger.sync_external([pod("cpu-node-pod", node_name="elsewhere", whole=1)])
    assert done.unknown_node == ("ml/cpu-node-pod",)
    assert ledger.external_holds() == []


def test_an_external_hold_is_not_released_by_id_nor_shown_as_a_grant(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.sync_external([pod("a", whole=1)])
    hold = ledger.external_holds()[0]
    result = ledger.release(hold.id, reason="admin")
    assert not result.released and "delete the pod" in result.message
    snapshot = ledger.snapshot()
    assert snapshot.grants == () and [r.id for r in snapshot.external] == [hold.id]
    assert snapshot.to_dict()["external"][0]["holder"] == "external:ml/a"
