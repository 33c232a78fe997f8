"""Queue ahead end to end (issue 40): ``dag.test()`` on the emulator, a real ledger on SQLite and PostgreSQL.

``train`` (1 GPU) is granted and ``evaluate`` (2 GPUs, which cannot be handed train's slice)
enters the queue at once, not granted before train's forecast end; when evaluate runs, its
reserve claims that request (its place, one history chain). A failed ``train`` withdraws it,
with the reason, and leaves nothing held.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.run_chain import read_run_chain
from airflow_gpupool.task_try import TaskTry
from tests.integration.pipeline_fixtures import handon_ledger, reservation_of, states

__all__ = ["handon_ledger"]  # the fixture, imported


def rows(ledger: Ledger) -> dict[str, Any]:
    query = select(schema.reservations)
    return {row.id: row for row in ledger.read(lambda conn: conn.execute(query).all())}


def test_evaluate_queues_ahead_of_train_and_claims_its_request(
    run_dag: Callable[[str], Any], k8s: Any, handon_ledger: Ledger
) -> None:
    dag_run = run_dag("queue_ahead_chain")

    assert states(dag_run) == {"train": "success", "evaluate": "success"}
    train = reservation_of(handon_ledger, dag_run, "train")
    evaluate = reservation_of(handon_ledger, dag_run, "evaluate")
    assert train.grant is not None and evaluate.grant is not None and train.ended_at is not None
    row = rows(handon_ledger)[evaluate.id]
    # Entered the queue while train ran (train's grant time: its forecast end is within the lead),
    # claimed under evaluate's own id: one reservation, no queued-ahead row left behind.
    assert row.ahead_of == train.id
    assert train.grant.granted_at <= row.created_at < train.ended_at
    assert not [rid for rid in rows(handon_ledger) if rid.startswith("qa-")]
    # Not granted while train ran (train ended before its forecast end: the claim made it due then).
    assert evaluate.grant.granted_at >= train.ended_at
    # The run's chain (the page, its API and gpupool chain) marks evaluate queued ahead, not train.
    steps = {s.task_id: s for s in read_run_chain(handon_ledger, dag_run.dag_id, dag_run.run_id).steps}
    assert (steps["train"].queued_ahead, steps["evaluate"].queued_ahead) == (False, True)
    assert handon_ledger.snapshot().grants == ()
    assert handon_ledger.check_invariants() == []


def test_a_failed_upstream_withdraws_the_queued_ahead_request(
    run_dag: Callable[[str], Any], k8s: Any, handon_ledger: Ledger
) -> None:
    dag_run = run_dag("queue_ahead_failed")

    assert states(dag_run) == {"train": "failed", "evaluate": "upstream_failed"}
    train = reservation_of(handon_ledger, dag_run, "train")
    assert train.state is ReservationState.RELEASED
    key = TaskTry(dag_run.dag_id, "evaluate", dag_run.run_id).task_key
    (ahead,) = [row for rid, row in rows(handon_ledger).items() if rid.startswith("qa-")]
    assert ahead.holder.startswith(key) and ahead.ahead_of == train.id
    assert ahead.state == "cancelled"
    assert ahead.message.startswith(f"withdrawn: upstream {train.holder} ({train.id}) ended released")
    assert handon_ledger.snapshot().grants == () and handon_ledger.snapshot().queue == ()
    assert handon_ledger.check_invariants() == []


def test_the_dag_param_turns_it_off(run_dag: Callable[[str], Any], k8s: Any, handon_ledger: Ledger) -> None:
    dag_run = run_dag("queue_ahead_param_off")

    assert states(dag_run) == {"train": "success", "evaluate": "success"}
    evaluate = reservation_of(handon_ledger, dag_run, "evaluate")
    assert rows(handon_ledger)[evaluate.id].ahead_of is None
    assert not [rid for rid in rows(handon_ledger) if rid.startswith("qa-")]
