"""Hand-on end to end (issue 40): ``dag.test()`` on the emulator, a real ledger on SQLite and PostgreSQL.

``train`` (2 GPUs) ends and hands the GPU ``evaluate`` needs on to it: one grant history chain
(train ended at the moment evaluate's grant began, on the same node and GPU), the other GPU
released. A skipped ``evaluate`` never claims it: it is released at the bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from airflow_gpupool.ledger import HANDED_PREFIX, Ledger, ReservationState
from airflow_gpupool.run_chain import read_run_chain
from airflow_gpupool.task_try import TaskTry
from tests.integration.pipeline_fixtures import handon_ledger, reservation_of, states

__all__ = ["handon_ledger"]  # the fixture, imported

RELEASED = ReservationState.RELEASED


def test_train_hands_its_slice_on_to_evaluate(
    run_dag: Callable[[str], Any], k8s: Any, handon_ledger: Ledger
) -> None:
    dag_run = run_dag("handon_chain")

    assert states(dag_run) == {"train": "success", "evaluate": "success"}
    train = reservation_of(handon_ledger, dag_run, "train")
    evaluate = reservation_of(handon_ledger, dag_run, "evaluate")
    assert train.state is RELEASED and evaluate.state is RELEASED
    assert train.grant is not None and evaluate.grant is not None
    key = TaskTry(dag_run.dag_id, "evaluate", dag_run.run_id).task_key
    assert train.message is not None and f"handed on to {key}" in train.message
    # One chain, no gap: evaluate's grant began when train's ended, on a GPU train held.
    assert evaluate.grant.granted_at == train.ended_at
    assert evaluate.grant.node == train.grant.node
    assert set(evaluate.grant.gpu_indices) < set(train.grant.gpu_indices)
    evaluate_pod = next(p for p in k8s.created_pods() if p["metadata"]["name"].startswith("evaluate"))
    annotations = evaluate_pod["metadata"]["annotations"]
    assert annotations["gpupool.io/gpus"] == ",".join(map(str, evaluate.grant.gpu_indices))
    # The run's chain (the page, its API and gpupool chain) shows the hand-on and no gap.
    steps = {s.task_id: s for s in read_run_chain(handon_ledger, dag_run.dag_id, dag_run.run_id).steps}
    assert (steps["train"].handed_on_to, steps["evaluate"].handed_on_from) == ("evaluate", "train")
    assert steps["evaluate"].gap_before == 0
    # Nothing left held, no handed reservation left behind.
    assert handon_ledger.snapshot().grants == ()
    assert not [e for e in handon_ledger.history() if e.id.startswith(HANDED_PREFIX)]
    assert handon_ledger.check_invariants() == []


@pytest.mark.parametrize("dag_id", ["handon_opted_out", "handon_param_off"])
def test_a_dag_that_opts_out_releases_as_before(
    run_dag: Callable[[str], Any], k8s: Any, handon_ledger: Ledger, dag_id: str
) -> None:
    dag_run = run_dag(dag_id)

    assert states(dag_run) == {"train": "success", "evaluate": "success"}
    train = reservation_of(handon_ledger, dag_run, "train")
    evaluate = reservation_of(handon_ledger, dag_run, "evaluate")
    assert train.message == "pod succeeded"
    assert evaluate.grant is not None and evaluate.grant.granted_at > (train.ended_at or 0)


def test_a_skipped_downstream_releases_the_handed_slice_at_the_bound(
    run_dag: Callable[[str], Any], k8s: Any, handon_ledger: Ledger
) -> None:
    dag_run = run_dag("handon_skipped")

    assert states(dag_run) == {"decide": "skipped", "train": "success", "evaluate": "skipped"}
    train = reservation_of(handon_ledger, dag_run, "train")
    assert train.message is not None and "handed on to" in train.message
    (handed,) = handon_ledger.snapshot().grants  # held for evaluate, which never comes
    assert handed.id.startswith(HANDED_PREFIX) and handed.grant is not None
    assert handed.grant.expires_at == pytest.approx(train.ended_at + 2)

    time.sleep(max(0.0, handed.grant.expires_at - handon_ledger.now()) + 0.2)
    handon_ledger.reap()

    assert handon_ledger.get(handed.id).state is ReservationState.EXPIRED
    assert handon_ledger.snapshot().grants == ()
    assert handon_ledger.check_invariants() == []


def test_a_downstream_whose_other_upstream_is_not_done_is_not_handed_on(
    run_dag: Callable[[str], Any], k8s: Any, handon_ledger: Ledger
) -> None:
    # The worker reads the run's task states (Airflow's task SDK): report runs after train.
    dag_run = run_dag("handon_waits")

    assert states(dag_run) == {"train": "success", "report": "success", "evaluate": "success"}
    train = reservation_of(handon_ledger, dag_run, "train")
    assert train.message == "pod succeeded"
    assert not [e for e in handon_ledger.history() if e.id.startswith(HANDED_PREFIX)]
