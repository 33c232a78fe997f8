"""FailureLadder: classify, record, decide and notify after a failed try, against a real SQLite ledger."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from airflow_gpupool.exceptions import ReservationTimeoutError
from airflow_gpupool.hooks import GpuPoolHook
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.notifiers import ESCALATION_KEY, MESSAGE_KEY
from airflow_gpupool.operators.escalation import EscalationPolicy
from airflow_gpupool.operators.failures import (
    ApplicationError,
    Classification,
    FailureClass,
    FailureReport,
    OutOfMemoryError,
    UnknownPodFailureError,
    report_of,
)
from airflow_gpupool.operators.retries.ladder import XCOM_FAILURE_KEY, FailedTry, FailureLadder
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.task_try import TaskTry
from tests.ledger_fixtures import node

LOG: Any = logging.getLogger("test-ladder")
QUARTER = GpuRequest(gpu_milli=250)
OOM = (Classification(FailureClass.OUT_OF_MEMORY, "OOMKilled", 137, "train-abc"), "CUDA out of memory")
APP = (Classification(FailureClass.APPLICATION_ERROR, "Error", 1, "train-abc"), "RuntimeError: boom")


@pytest.fixture
def hook(tmp_path: Path) -> Iterator[GpuPoolHook]:
    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger = Ledger.create(url)
    ledger.upsert_nodes([node("n1", gpus=2)])
    ledger.close()
    hook = GpuPoolHook(None, ledger_url=url)
    yield hook
    hook.close()


def try_of(n: int, **kwargs: Any) -> FailedTry:
    task = TaskTry("retrain", "train", "manual__1", -1, n, "worker-1")
    return FailedTry(task=task, reservation_id=task.reservation_id, request=QUARTER, **kwargs)


def report(raised: BaseException) -> FailureReport:
    found = report_of(raised)
    assert found is not None, f"{raised!r} carries no gpupool_failure report"
    return found


class FakeTaskInstance:
    def __init__(self) -> None:
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def test_out_of_memory_retries_larger_and_the_next_try_asks_for_it(hook: GpuPoolHook) -> None:
    ladder = FailureLadder(hook, EscalationPolicy(), log=LOG)
    failed = try_of(1, retries_left=True, gpu_model="A100", observed=OOM)
    error = RuntimeError("pod failed")
    ti = FakeTaskInstance()

    raised = ladder.failed({"ti": ti}, failed, error)

    # KPO's exception, as it was, with the class and the decision added (never substituted).
    assert raised is error and str(raised) == "pod failed"
    assert report(raised).failure_class is FailureClass.OUT_OF_MEMORY and report(raised).retry
    assert isinstance(report(raised).error(), OutOfMemoryError)
    assert raised.__notes__ == [
        "gpupool: pod train-abc failed: out_of_memory (OOMKilled, exit code 137, no checkpoint); "
        + report(raised).decision
    ]
    assert ti.xcoms[XCOM_FAILURE_KEY] == {
        "failure_class": "out_of_memory",
        "reason": "OOMKilled",
        "exit_code": 137,
        "pod_name": "train-abc",
        "remedy": "retry_larger",
        "decision": report(raised).decision,
        "retry": True,
        "last_checkpoint": None,
    }
    (attempt,) = hook.attempt_history(failed.task.task_key)
    assert (attempt.failure_class, attempt.remedy, attempt.next_request) == (
        "out_of_memory",
        "retry_larger",
        GpuRequest(gpu_milli=500),
    )
    assert attempt.reservation_id == failed.reservation_id and attempt.exit_code == 137
    assert ladder.escalated_request(failed.task) is None, "the first try asks for its own request"
    assert ladder.escalated_request(TaskTry("retrain", "train", "manual__1", -1, 2)) == GpuRequest(
        gpu_milli=500
    )


def test_exhausted_retries_fail_and_notify_once(hook: GpuPoolHook) -> None:
    sent: list[dict[str, Any]] = []
    ladder = FailureLadder(hook, EscalationPolicy(), notifier=sent.append, log=LOG)
    ladder.failed({}, try_of(1, retries_left=True, observed=APP), RuntimeError("pod failed"))

    kpo = AirflowException("Pod train-abc returned a failure.")
    raised = ladder.failed({"run_id": "manual__1"}, try_of(2, retries_left=False, observed=APP), kpo)
    again = ladder.failed({}, try_of(2, retries_left=False, observed=APP), RuntimeError())

    # No retries left: Airflow fails the task anyway, so KPO's exception is raised as it was.
    assert raised is kpo and str(raised) == "Pod train-abc returned a failure."
    assert isinstance(report(raised).error(), ApplicationError) and not report(raised).retry
    assert "application_error" in raised.__notes__[0] and "retries exhausted" in raised.__notes__[0]
    assert isinstance(again, RuntimeError)
    (context,) = sent
    escalation = context[ESCALATION_KEY]
    assert context["run_id"] == "manual__1" and "needs a person" in context[MESSAGE_KEY]
    assert (escalation["try_number"], escalation["log_tail"]) == (2, "RuntimeError: boom")
    assert [t["try_number"] for t in escalation["tried"]] == [1, 2]
    assert escalation["policy"]["out_of_memory"] == "retry_larger"


def test_a_broken_notifier_does_not_hide_the_failure(hook: GpuPoolHook) -> None:
    def broken(context: Any) -> None:
        raise ConnectionError("Slack is down")

    ladder = FailureLadder(
        hook, EscalationPolicy.of({"application_error": "escalate"}), notifier=broken, log=LOG
    )
    error = RuntimeError("pod failed")
    raised = ladder.failed({}, try_of(1, retries_left=True, observed=APP), error)
    assert isinstance(raised, AirflowFailException) and raised.__cause__ is error
    assert report(raised).failure_class is FailureClass.APPLICATION_ERROR


def test_skip_and_fail_pass_through_unrecorded(hook: GpuPoolHook) -> None:
    ladder = FailureLadder(hook, EscalationPolicy(), log=LOG)
    skip = AirflowSkipException("nothing to do")
    assert ladder.failed({}, try_of(1, retries_left=True), skip) is skip
    assert hook.attempt_history(try_of(1, retries_left=True).task.task_key) == []


def test_without_a_pod_the_error_is_the_reason(hook: GpuPoolHook) -> None:
    ladder = FailureLadder(hook, EscalationPolicy(), log=LOG)
    error = RuntimeError("API server gone")
    raised = ladder.failed({}, try_of(1, retries_left=True), error)
    assert raised is error and isinstance(report(raised).error(), UnknownPodFailureError)
    (attempt,) = hook.attempt_history(try_of(1, retries_left=True).task.task_key)
    assert attempt.message.startswith("RuntimeError: API server gone: unknown: retrying")


def test_a_reservation_timeout_is_raised_as_it_is(hook: GpuPoolHook) -> None:
    ladder = FailureLadder(hook, EscalationPolicy(), log=LOG)
    timeout = ReservationTimeoutError("gp-x", 300, ["n1: needs 1 free GPUs"])
    assert ladder.failed({}, try_of(1, retries_left=True), timeout) is timeout
    (attempt,) = hook.attempt_history(try_of(1, retries_left=True).task.task_key)
    assert attempt.failure_class == "reservation_timeout"


def test_a_lost_lease_is_classed_lease_lost_and_retried_without_penalty(hook: GpuPoolHook) -> None:
    from airflow_gpupool.exceptions import LeaseLostError

    ladder = FailureLadder(hook, EscalationPolicy(), log=LOG)
    lost = LeaseLostError.of("gp-x", "grant gp-x can no longer be renewed: it is released")
    # The deleted pod looked like an unknown failure; the lease is why it stopped.
    failed = try_of(1, retries_left=True, observed=APP)

    raised = ladder.failed({}, failed, lost)

    assert raised is lost
    assert report(raised).classification.pod_name == "train-abc"
    # An AirflowException (what task code catches), not AirflowFailException: Airflow retries it.
    assert isinstance(raised, AirflowException) and not isinstance(raised, AirflowFailException)
    (attempt,) = hook.attempt_history(failed.task.task_key)
    assert (attempt.failure_class, attempt.remedy, attempt.next_request) == ("lease_lost", "retry", None)
    assert attempt.message.startswith("lease of gp-x lost: grant gp-x can no longer be renewed")


def test_a_try_is_annotated_once_even_when_walked_twice(hook: GpuPoolHook) -> None:
    ladder = FailureLadder(hook, EscalationPolicy(), log=LOG)
    error = RuntimeError("pod failed")
    ladder.failed({}, try_of(1, retries_left=True, observed=APP), error)
    ladder.failed({}, try_of(1, retries_left=True, observed=APP), error)
    assert len(error.__notes__) == 1


def test_a_broken_xcom_push_does_not_hide_the_failure(hook: GpuPoolHook) -> None:
    class BrokenTaskInstance:
        def xcom_push(self, key: str, value: Any) -> None:
            raise ConnectionError("execution API gone")

    ladder = FailureLadder(hook, EscalationPolicy(), log=LOG)
    error = RuntimeError("pod failed")
    assert (
        ladder.failed({"ti": BrokenTaskInstance()}, try_of(1, retries_left=True, observed=APP), error)
        is error
    )


def test_fail_fast_where_the_ladder_stops_retries_carries_kpos_message(hook: GpuPoolHook) -> None:
    image = (Classification(FailureClass.IMAGE_PULL, "ErrImagePull", None, "train-abc"), "")
    ladder = FailureLadder(hook, EscalationPolicy(), log=LOG)
    kpo = AirflowException("Pod train-abc returned a failure.")

    raised = ladder.failed({}, try_of(1, retries_left=True, observed=image), kpo)

    assert isinstance(raised, AirflowFailException) and raised.__cause__ is kpo
    assert str(raised) == "Pod train-abc returned a failure."
    assert report(raised).remedy == "fail" and report(raised).failure_class is FailureClass.IMAGE_PULL


def test_a_gpu_fault_chooses_the_cpu_fallback_and_the_next_tries_take_it(hook: GpuPoolHook) -> None:
    ladder = FailureLadder(hook, EscalationPolicy.of(None, cpu_fallback=True), log=LOG)
    xid = (Classification(FailureClass.GPU_FAULT, "NVRM: Xid", 1, "train-abc"), "NVRM: Xid (PCI:0): 79")
    ti = FakeTaskInstance()
    assert not ladder.cpu_fallback_chosen(TaskTry("retrain", "train", "manual__1", -1, 2))

    raised = ladder.failed(
        {"ti": ti}, try_of(1, retries_left=True, observed=xid, cpu_fallback=True), RuntimeError()
    )

    assert report(raised).remedy == "cpu_fallback" and report(raised).retry
    assert ti.xcoms[XCOM_FAILURE_KEY]["remedy"] == "cpu_fallback"
    (attempt,) = hook.attempt_history("retrain/train/manual__1/map--1")
    assert (attempt.failure_class, attempt.remedy) == ("gpu_fault", "cpu_fallback")
    assert ladder.cpu_fallback_chosen(TaskTry("retrain", "train", "manual__1", -1, 2))
    assert ladder.cpu_fallback_chosen(TaskTry("retrain", "train", "manual__1", -1, 3)), "sticky for the run"
    assert not ladder.cpu_fallback_chosen(TaskTry("retrain", "train", "manual__2", -1, 2)), "another run"


def test_host_memory_out_of_memory_never_falls_back_to_the_cpu(hook: GpuPoolHook) -> None:
    ladder = FailureLadder(hook, EscalationPolicy.of(None, cpu_fallback=True), log=LOG)
    whole = FailedTry(
        task=TaskTry("retrain", "train", "manual__1", -1, 1, "worker-1"),
        reservation_id="gp-x",
        request=GpuRequest(gpus=2),
        retries_left=True,
        observed=OOM,  # OOMKilled: the host's memory, as short on the CPU
        cpu_fallback=True,
    )

    raised = ladder.failed({}, whole, RuntimeError("pod failed"))

    assert report(raised).remedy == "retry_larger" and not report(raised).retry
    assert isinstance(raised, AirflowFailException)


EVICTED = (Classification(FailureClass.EVICTED, "EvictionByEvictionAPI", 143, "train-abc"), "")
ON_DEMAND = ("gpupool.io/capacity-type", "on-demand")


@pytest.mark.parametrize(
    ("limit", "evictions", "on_demand"),
    [
        pytest.param("2", 2, True, id="two-evictions-of-two"),
        pytest.param("2", 1, False, id="one-eviction-of-two"),
        pytest.param("1", 1, True, id="one-of-one"),
        pytest.param("0", 3, False, id="never"),
    ],
)
def test_after_enough_evictions_the_run_keeps_to_on_demand_capacity(
    hook: GpuPoolHook, monkeypatch: pytest.MonkeyPatch, limit: str, evictions: int, on_demand: bool
) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__EVICTIONS_BEFORE_ON_DEMAND", limit)
    ladder = FailureLadder(hook, EscalationPolicy(), log=LOG)
    for n in range(1, evictions + 1):
        raised = ladder.failed({}, try_of(n, retries_left=True, observed=EVICTED), RuntimeError("pod failed"))
        assert report(raised).failure_class is FailureClass.EVICTED and report(raised).retry
    # An application error in between is not an eviction.
    ladder.failed({}, try_of(evictions + 1, retries_left=True, observed=APP), RuntimeError("pod failed"))
    spot = GpuRequest(gpus=1, node_labels=(("gpupool.io/capacity-type", "spot"),))

    moved = ladder.after_evictions(TaskTry("retrain", "train", "manual__1", -1, evictions + 2), spot)

    assert moved.node_labels == ((ON_DEMAND,) if on_demand else spot.node_labels)
    assert ladder.after_evictions(TaskTry("retrain", "train", "manual__1", -1, 1), spot) is spot


def test_a_bad_eviction_limit_is_a_configuration_error(
    hook: GpuPoolHook, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_gpupool.exceptions import ConfigurationError

    monkeypatch.setenv("AIRFLOW__GPUPOOL__EVICTIONS_BEFORE_ON_DEMAND", "-1")
    with pytest.raises(ConfigurationError, match="evictions_before_on_demand"):
        FailureLadder(hook, EscalationPolicy(), log=LOG).after_evictions(
            TaskTry("retrain", "train", "manual__1", -1, 2), QUARTER
        )
