"""External holds corrected by the node agent's report, on SQLite and PostgreSQL.

A foreign pod with no annotation naming its GPUs is guessed onto the lowest free ones; the agent's
process list (pods found through cgroups) shows where it really runs, and the hold moves there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from airflow_gpupool.agent.collect import NvmlCollector
from airflow_gpupool.ledger import GpuSample, Ledger, NodeReport, ProcessSample, ReservationState
from airflow_gpupool.pod_gpus import ExternalPod, GpuUse
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing.fake_nvml import FakeNvml, node_spec
from tests.ledger_fixtures import FakeClock, node


def pod(name: str, **use: object) -> ExternalPod:
    return ExternalPod("ml", name, f"uid-{name}", "n1", GpuUse(**use))  # type: ignore[arg-type]


def report(processes: dict[int, list[str]], gpus: int = 4) -> NodeReport:
    """A report of node n1: per GPU index, the pod uids of its processes."""
    samples = tuple(
        GpuSample(
            index=i,
            uuid=f"GPU-n1-{i}",
            bus_id="",
            memory_total_mib=81920,
            memory_used_mib=1000 * len(processes.get(i, [])),
            processes=tuple(
                ProcessSample(pid=100 + i * 10 + k, memory_mib=1000, pod_uid=uid)
                for k, uid in enumerate(processes.get(i, []))
            ),
        )
        for i in range(gpus)
    )
    return NodeReport(node="n1", collected_at=0.0, interval_s=30.0, gpus=samples)


def beat(ledger: Ledger, r: NodeReport):  # type: ignore[no-untyped-def]
    return ledger.record_report(r, missed_heartbeats=3, leak_grace_seconds=60.0)


def held(ledger: Ledger) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in ledger.external_holds():
        assert r.grant is not None
        out.setdefault(r.holder, []).extend(r.grant.gpu_indices)
    return {k: sorted(v) for k, v in out.items()}


def test_a_guessed_hold_moves_to_the_gpu_the_agent_sees_and_frees_the_guess(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    ledger.sync_external([pod("notebook", whole=1)])
    assert held(ledger) == {"external:ml/notebook": [0]}

    with caplog.at_level(logging.INFO):
        result = beat(ledger, report({2: ["uid-notebook"]}))

    assert [(m.pod, m.from_gpu, m.to_gpu) for m in result.moved] == [("ml/notebook", 0, 2)]
    assert held(ledger) == {"external:ml/notebook": [2]}
    assert ledger.check_invariants() == []
    grant = ledger.reserve(GpuRequest(gpus=1), "h").grant
    assert grant is not None and grant.gpu_indices == (0,)  # the guess is free again
    moves = [r for r in caplog.records if "hold moved from GPU 0 to GPU 2" in r.getMessage()]
    assert len(moves) == 1 and "ml/notebook" in moves[0].getMessage()
    assert result.leaks == () and ledger.suspect_nodes() == {}

    caplog.clear()
    with caplog.at_level(logging.INFO):
        again = beat(ledger, report({2: ["uid-notebook"]}))
    assert again.moved == () and held(ledger) == {"external:ml/notebook": [2]}
    assert not [r for r in caplog.records if "hold moved" in r.getMessage()]  # logged once


def test_a_two_gpu_hold_moves_only_its_wrong_row_and_a_relist_keeps_it(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    ledger.sync_external([pod("infer", whole=2)])
    assert held(ledger) == {"external:ml/infer": [0, 1]}

    result = beat(ledger, report({1: ["uid-infer"], 3: ["uid-infer"]}))

    assert [(m.from_gpu, m.to_gpu) for m in result.moved] == [(0, 3)]
    assert held(ledger) == {"external:ml/infer": [1, 3]}
    assert ledger.sync_external([pod("infer", whole=2)], complete=True).kept == 1
    assert held(ledger) == {"external:ml/infer": [1, 3]}
    assert ledger.check_invariants() == []


def test_a_gpu_a_grant_holds_is_drift_the_grant_keeps_it_and_the_node_turns_suspect(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    mine = ledger.reserve(GpuRequest(gpus=1), "h", reservation_id="gp-1")
    assert mine.grant is not None and mine.grant.gpu_indices == (0,)
    ledger.sync_external([pod("notebook", whole=1)])
    assert held(ledger) == {"external:ml/notebook": [1]}

    with caplog.at_level(logging.WARNING):
        result = beat(ledger, report({0: ["uid-notebook"]}, gpus=2))

    assert result.moved == ()
    assert [(d.pod, d.gpu, d.grant) for d in result.drift] == [("ml/notebook", 0, "gp-1")]
    assert held(ledger) == {"external:ml/notebook": [1]}
    got = ledger.get("gp-1")
    assert got.state is ReservationState.GRANTED and got.grant is not None and got.grant.gpu_indices == (0,)
    assert list(ledger.suspect_nodes()) == ["n1"]
    (warning,) = [r for r in caplog.records if "which grant gp-1 holds" in r.getMessage()]
    assert "ml/notebook" in warning.getMessage() and "GPU 0" in warning.getMessage()
    assert ledger.check_invariants() == []
    # Placement avoids the node until it is resynced.
    ledger.release("gp-1")
    assert ledger.reserve(GpuRequest(gpus=1), "h2", timeout=600).state is ReservationState.WAITING

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        beat(ledger, report({0: ["uid-notebook"]}, gpus=2))
    assert not [r for r in caplog.records if "which grant" in r.getMessage()]  # once per episode


def test_a_report_without_the_pods_processes_changes_nothing(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    ledger.sync_external([pod("notebook", whole=1)])

    result = beat(ledger, report({3: ["uid-someone-else"], 1: []}))

    assert result.moved == () and result.drift == ()
    assert held(ledger) == {"external:ml/notebook": [0]}
    assert ledger.suspect_nodes() == {}


def test_the_real_collector_over_fake_nvml_moves_the_hold(
    make_ledger: Callable[..., Ledger], clock: FakeClock
) -> None:
    ledger = make_ledger()
    ledger.upsert_nodes([node("n1", gpus=2)])
    ledger.sync_external([pod("notebook", whole=1)])
    nvml = FakeNvml(node_spec("n1", 2))
    nvml.spec["gpus"][1]["processes"] = [{"pid": 7, "memory_mib": 2048, "pod_uid": "uid-notebook"}]
    collector = NvmlCollector(nvml, "n1", pod_uid_of=nvml.pod_uid_of, clock=clock)
    collector.open()

    result = ledger.record_report(collector.sample(30.0), missed_heartbeats=3, leak_grace_seconds=60.0)

    assert [(m.from_gpu, m.to_gpu) for m in result.moved] == [(0, 1)]
    assert held(ledger) == {"external:ml/notebook": [1]}
    assert ledger.check_invariants() == []
