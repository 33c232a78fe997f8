"""Which downstream GPU step an ending step hands its slice on to (issue 40): read from the DAG itself."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_gpupool.exceptions import ConfigurationError, InvalidRequestError
from airflow_gpupool.operators import GpuPodOperator
from airflow_gpupool.operators.steps.hand_on import hand_on_target
from airflow_gpupool.resources import GpuRequest

LOG = logging.getLogger("test")


class Ti:
    dag_id, run_id = "pipeline", "run-1"


def context(**params: Any) -> dict[str, Any]:
    return {"ti": Ti(), "params": params}


def pipeline(train: dict[str, Any] | None = None, **evaluate: Any) -> GpuPodOperator:
    with DAG("pipeline", schedule=None, start_date=datetime(2026, 1, 1)):
        first = GpuPodOperator(task_id="train", image="t:1", gpus=2, **(train or {}))
        first >> GpuPodOperator(task_id="evaluate", image="e:1", **{"gpus": 1, **evaluate})
    return first


def test_the_downstream_gpu_step_and_its_request_are_read_from_the_dag() -> None:
    target = hand_on_target(pipeline(), context(), LOG)

    assert target is not None
    assert (target.task_id, target.task_key) == ("evaluate", "pipeline/evaluate/run-1/map--1")
    assert target.request == GpuRequest(gpus=1)


@pytest.mark.parametrize(
    ("train", "evaluate", "params", "said"),
    [
        pytest.param({"hand_on": False}, {}, {}, "train has hand_on=False", id="upstream-opts-out"),
        pytest.param({}, {"hand_on": False}, {}, "it has hand_on=False", id="downstream-opts-out"),
        pytest.param({}, {}, {"gpupool_hand_on": False}, "gpupool_hand_on is false", id="dag-param"),
        pytest.param({}, {"gpus": "{{ params.gpus }}"}, {}, "templated", id="templated-request"),
        pytest.param({}, {"ledger_conn_id": "other"}, {}, "another ledger", id="another-ledger"),
    ],
)
def test_nothing_is_handed_on_and_the_log_says_why(
    train: dict[str, Any],
    evaluate: dict[str, Any],
    params: dict[str, Any],
    said: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="test"):
        assert hand_on_target(pipeline(train, **evaluate), context(**params), LOG) is None
    assert said in caplog.text


def test_a_downstream_that_is_not_a_gpu_step_is_not_a_target() -> None:
    from airflow.providers.standard.operators.empty import EmptyOperator

    with DAG("pipeline", schedule=None, start_date=datetime(2026, 1, 1)):
        train = GpuPodOperator(task_id="train", image="t:1", gpus=1)
        train >> EmptyOperator(task_id="report")

    assert hand_on_target(train, context(), LOG) is None


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_hand_on_must_be_a_bool_at_parse_time(value: object) -> None:
    with pytest.raises(ConfigurationError, match="hand_on must be True or False"):
        GpuPodOperator(task_id="train", image="t:1", gpus=1, hand_on=value)  # type: ignore[arg-type]


def test_handoff_seconds_is_checked_at_parse_time() -> None:
    with pytest.raises(InvalidRequestError):
        GpuPodOperator(task_id="train", image="t:1", gpus=1, handoff_seconds=0)


def test_a_downstream_request_that_cannot_be_built_is_logged_and_not_handed_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    train = pipeline()
    (evaluate,) = train.downstream_list

    def unbuildable() -> GpuRequest:
        raise InvalidRequestError("gpus", "many", "a whole number")

    monkeypatch.setattr(evaluate, "hand_on_request", unbuildable)
    with caplog.at_level(logging.INFO, logger="test"):
        assert hand_on_target(train, context(), LOG) is None
    assert "GPU slice not handed on to evaluate: its request is invalid" in caplog.text
