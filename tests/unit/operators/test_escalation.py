"""The escalation ladder: remedies per class, the next larger slice against the inventory, state in the ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.ledger import Ledger, TaskAttempt, TaskAttempts
from airflow_gpupool.operators.escalation import (
    EscalationPolicy,
    Remedy,
    decide,
    larger_requests,
    next_larger,
)
from airflow_gpupool.operators.failures import FailureClass
from airflow_gpupool.placement.snapshot import ClusterSnapshot, GpuState, NodeState
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node

T4, A100, H100 = "Tesla-T4", "A100-80GB", "H100-80GB"


def cluster(*nodes: NodeState) -> ClusterSnapshot:
    return ClusterSnapshot(nodes)


def gpu_node(
    name: str, model: str, memory_mib: int, n: int = 2, mig: tuple[tuple[str, str], ...] = ()
) -> NodeState:
    gpus = tuple(GpuState(i, model, memory_mib) for i in range(n))
    if mig:
        gpus += (GpuState(n, model, memory_mib, free_milli=0, mig_free=mig, partitioned=True),)
    return NodeState(name, 64000, 512000, gpus)


MIXED = cluster(gpu_node("t4", T4, 15360), gpu_node("a100", A100, 81920), gpu_node("h100", H100, 97280))


def describe(requests: list[GpuRequest]) -> list[str]:
    return [r.describe().split(",")[0] for r in requests]


def test_fraction_ladder_grows_to_a_whole_gpu_then_bigger_models() -> None:
    request = GpuRequest(gpu_milli=125, gpu_memory_mib=2048)

    assert describe(larger_requests(request, T4, MIXED)) == [
        "0.25 GPU (4096 MiB GPU memory)",
        "0.5 GPU (8192 MiB GPU memory)",
        "1 GPU",
        f"1 GPU on {A100}|{H100}",
    ]


def test_mig_ladder_takes_the_next_profile_of_the_family_then_a_whole_gpu() -> None:
    rungs = larger_requests(GpuRequest(mig_profile="1g.10gb"), A100, MIXED)

    assert [r.mig_profile for r in rungs[:5]] == ["1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    assert rungs[5].gpus == 1 and rungs[5].mig_profile is None
    # Only 1g.10gb slices exist: the first rung the inventory can hold is a whole GPU.
    mig_only = cluster(gpu_node("mig", A100, 81920, n=1, mig=(("s0", "1g.10gb"), ("s1", "1g.10gb"))))
    assert next_larger(GpuRequest(mig_profile="1g.10gb"), A100, mig_only) == GpuRequest(gpus=1)


def test_whole_gpu_moves_to_a_model_of_gpu_models_with_more_memory() -> None:
    request = GpuRequest(gpus=1, gpu_models=[T4, A100])

    assert next_larger(request, T4, MIXED) == GpuRequest(gpus=1, gpu_models=[A100])
    assert next_larger(GpuRequest(gpus=1, gpu_models=[H100]), H100, MIXED) is None, "nothing bigger"
    assert next_larger(GpuRequest(gpus=4), A100, MIXED) is None, "no node has 4 bigger GPUs"
    assert larger_requests(GpuRequest(), None, MIXED) == []


@pytest.mark.parametrize(
    ("failure", "retries_left", "expected"),
    [
        (FailureClass.PREEMPTED, True, (Remedy.RETRY, True, False)),
        (FailureClass.NODE_LOST, True, (Remedy.RETRY, True, False)),
        (FailureClass.IMAGE_PULL, True, (Remedy.FAIL, False, False)),
        (FailureClass.APPLICATION_ERROR, True, (Remedy.RETRY, True, False)),
        (FailureClass.APPLICATION_ERROR, False, (Remedy.RETRY, False, True)),
        (FailureClass.OUT_OF_MEMORY, True, (Remedy.RETRY_LARGER, True, False)),
        (FailureClass.OUT_OF_MEMORY, False, (Remedy.RETRY_LARGER, False, True)),
    ],
)
def test_default_ladder(
    failure: FailureClass, retries_left: bool, expected: tuple[Remedy, bool, bool]
) -> None:
    decision = decide(
        EscalationPolicy(),
        failure,
        GpuRequest(gpu_milli=500),
        retries_left=retries_left,
        failed_model=T4,
        cluster=MIXED,
    )

    assert (decision.remedy, decision.retry, decision.escalate) == expected
    if decision.retry and failure is FailureClass.OUT_OF_MEMORY:
        assert decision.next_request == GpuRequest(gpus=1)


def test_out_of_memory_with_no_larger_slice_escalates() -> None:
    decision = decide(
        EscalationPolicy(),
        FailureClass.OUT_OF_MEMORY,
        GpuRequest(gpus=1, gpu_models=[H100]),
        retries_left=True,
        failed_model=H100,
        cluster=MIXED,
    )

    assert (decision.retry, decision.escalate, decision.next_request) == (False, True, None)
    assert decision.reason == "out_of_memory: no larger slice fits the inventory; escalating"


def test_policy_overrides_and_bad_configuration() -> None:
    policy = EscalationPolicy.of({"image_pull": "escalate", "preempted": "fail"})

    assert policy.remedy(FailureClass.IMAGE_PULL) is Remedy.ESCALATE
    assert policy.remedy(FailureClass.OUT_OF_MEMORY) is Remedy.RETRY_LARGER
    assert decide(policy, FailureClass.IMAGE_PULL, GpuRequest(gpus=1), retries_left=True).escalate is True
    with pytest.raises(ConfigurationError, match="page"):
        EscalationPolicy.of({"preempted": "page"})


def test_attempts_cross_tries_in_the_ledger_and_escalate_once(tmp_path: Path) -> None:
    ledger = Ledger.create(f"sqlite:///{tmp_path}/ledger.db")
    ledger.upsert_nodes([node("n1", gpus=1)])
    attempts = TaskAttempts(ledger)
    key = "dag/train/run/map--1"
    first = TaskAttempt(
        task_key=key,
        try_number=1,
        reservation_id="gp-1",
        failure_class="out_of_memory",
        remedy="retry_larger",
        request=GpuRequest(gpu_milli=250),
        message="OOMKilled",
        exit_code=137,
        next_request=GpuRequest(gpu_milli=500),
        gpu_model="A100",
        checkpoint_step=3,
    )

    attempts.record(first)
    attempts.record(first)  # a second record of a try changes nothing
    attempts.record(
        TaskAttempt(key, 2, "gp-2", "application_error", "retry", GpuRequest(gpu_milli=500), "exit 1")
    )

    history = attempts.history(key)
    assert [(a.try_number, a.next_request) for a in history] == [(1, GpuRequest(gpu_milli=500)), (2, None)]
    assert history[0].checkpoint_step == 3 and history[0].exit_code == 137
    assert attempts.claim_escalation(key, 2) is True
    assert attempts.claim_escalation(key, 2) is False
    assert attempts.claim_escalation(key, 1) is False
    assert attempts.history("other") == []
    assert ledger.snapshot().grants == ()
    ledger.close()


def test_a_v1_ledger_migrates_to_the_latest_and_keeps_its_reservations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_gpupool.exceptions import LedgerSchemaError
    from airflow_gpupool.ledger.store import migrations

    url = f"sqlite:///{tmp_path}/old.db"
    with monkeypatch.context() as m:
        m.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:1])
        m.setattr(migrations, "LATEST", 1)
        old = Ledger.create(url)
        old.upsert_nodes([node("n1", gpus=1)])
        held = old.reserve(GpuRequest(gpus=1), "old-holder")
        old.close()
    with pytest.raises(LedgerSchemaError, match=f"v1, this code needs v{migrations.LATEST}"):
        Ledger(url).snapshot()

    ledger = Ledger(url)
    assert ledger.migrate() == list(range(2, migrations.LATEST + 1))
    assert ledger.get(held.id).holder == "old-holder"
    assert TaskAttempts(ledger).history("any") == []
    ledger.close()


def test_cpu_fallback_is_the_default_for_a_gpu_fault_only_with_a_cpu_variant() -> None:
    assert EscalationPolicy.of(None).remedy(FailureClass.GPU_FAULT) is Remedy.RETRY
    policy = EscalationPolicy.of(None, cpu_fallback=True)
    assert policy.remedy(FailureClass.GPU_FAULT) is Remedy.CPU_FALLBACK
    assert policy.remedy(FailureClass.APPLICATION_ERROR) is Remedy.RETRY
    # An explicit override wins over the cpu_fallback default.
    assert EscalationPolicy.of({"gpu_fault": "fail"}, cpu_fallback=True).remedy(FailureClass.GPU_FAULT) is (
        Remedy.FAIL
    )

    decision = decide(policy, FailureClass.GPU_FAULT, GpuRequest(gpus=1), retries_left=True)
    assert (decision.remedy, decision.retry, decision.escalate, decision.next_request) == (
        Remedy.CPU_FALLBACK,
        True,
        False,
        None,
    )
    assert decision.reason == "gpu_fault: retrying on the CPU fallback (GPUPOOL_DEVICE=cpu)"
    spent = decide(policy, FailureClass.GPU_FAULT, GpuRequest(gpus=1), retries_left=False)
    assert (spent.retry, spent.escalate, spent.reason) == (False, True, "gpu_fault: retries exhausted")


def test_cpu_fallback_without_a_cpu_variant_fails_at_parse_time() -> None:
    with pytest.raises(ConfigurationError, match=r"\['preempted'\].*needs the task's cpu_fallback=True"):
        EscalationPolicy.of({"preempted": "cpu_fallback"})
    with pytest.raises(ConfigurationError, match="cpu_fallback=True"):
        EscalationPolicy.of(EscalationPolicy(remedies={FailureClass.GPU_FAULT: Remedy.CPU_FALLBACK}))


def test_out_of_memory_with_no_larger_slice_falls_back_to_the_cpu_when_it_can() -> None:
    request = GpuRequest(gpus=1, gpu_models=[H100])
    kwargs = {"retries_left": True, "failed_model": H100, "cluster": MIXED}

    fallback = decide(EscalationPolicy(), FailureClass.OUT_OF_MEMORY, request, cpu_fallback=True, **kwargs)
    assert (fallback.remedy, fallback.retry, fallback.escalate) == (Remedy.CPU_FALLBACK, True, False)
    # A larger slice still comes first.
    larger = decide(
        EscalationPolicy(), FailureClass.OUT_OF_MEMORY, GpuRequest(gpu_milli=500), cpu_fallback=True, **kwargs
    )
    assert (larger.remedy, larger.next_request) == (Remedy.RETRY_LARGER, GpuRequest(gpus=1))
