"""A GPU task's ``capacity``: its own choice, or the default rule, as a node label of its request."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_gpupool.exceptions import ConfigurationError, InvalidRequestError
from airflow_gpupool.governance.capacity import Capacity
from airflow_gpupool.operators import GpuPodOperator
from airflow_gpupool.operators.capacity import with_capacity
from airflow_gpupool.resources import GpuRequest

SPOT, ON_DEMAND = ("gpupool.io/capacity-type", "spot"), ("gpupool.io/capacity-type", "on-demand")
TRAINING = GpuRequest(gpus=1, workload_class="training", preemptible=True)  # type: ignore[arg-type]


@pytest.fixture
def spot_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__SPOT_PRICE_RATIO", "0.5")


@pytest.mark.parametrize(
    ("capacity", "node_labels"),
    [(Capacity.SPOT, (SPOT,)), (Capacity.ON_DEMAND, (ON_DEMAND,)), (Capacity.ANY, ())],
)
def test_a_tasks_own_capacity_is_required(
    capacity: Capacity, node_labels: tuple[tuple[str, str], ...]
) -> None:
    request = with_capacity(
        GpuRequest(gpus=1, priority=500), capacity, checkpointed=False, expected_seconds=None
    )
    assert (request.node_labels, request.prefer_node_labels) == (node_labels, ())


@pytest.mark.parametrize(
    "urgent",
    [
        pytest.param(GpuRequest(gpus=1, priority=100), id="priority-at-threshold"),
        pytest.param(GpuRequest(gpus=1, workload_class="inference"), id="inference"),  # type: ignore[arg-type]
    ],
)
def test_urgent_work_must_run_on_demand_by_default(urgent: GpuRequest, spot_ratio: None) -> None:
    request = with_capacity(urgent, None, checkpointed=True, expected_seconds=60)
    assert (request.node_labels, request.prefer_node_labels) == ((ON_DEMAND,), ())


@pytest.mark.parametrize(
    ("ratio", "expected_seconds", "prefers_spot"),
    [
        pytest.param("0.5", 1800, True, id="cheap-enough-for-a-short-run"),
        pytest.param("0.5", 7200, False, id="not-cheap-enough-for-a-long-run"),
        pytest.param("0.3", None, True, id="cheap-enough-for-a-run-of-unknown-length"),
        pytest.param("", 1800, False, id="price-unknown"),
    ],
)
def test_checkpointed_preemptible_training_prefers_cheap_spot(
    ratio: str, expected_seconds: float | None, prefers_spot: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__SPOT_PRICE_RATIO", ratio)
    request = with_capacity(TRAINING, None, checkpointed=True, expected_seconds=expected_seconds)
    assert request.node_labels == ()  # a preference only: it runs on on-demand when no spot node fits
    assert request.prefer_node_labels == ((SPOT,) if prefers_spot else ())


def test_without_checkpoints_or_preemptibility_training_does_not_prefer_spot(spot_ratio: None) -> None:
    assert with_capacity(TRAINING, None, checkpointed=False, expected_seconds=60) == TRAINING
    not_preemptible = GpuRequest(gpus=1, workload_class="training")  # type: ignore[arg-type]
    assert with_capacity(not_preemptible, None, checkpointed=True, expected_seconds=60) == not_preemptible


def test_a_capacity_label_among_the_tasks_node_labels_is_its_choice(spot_ratio: None) -> None:
    request = GpuRequest(gpus=1, priority=100, node_labels=(SPOT,))
    assert with_capacity(request, None, checkpointed=False, expected_seconds=None) == request


@pytest.mark.parametrize(
    "cloud_label",
    [
        ("karpenter.sh/capacity-type", "spot"),
        ("cloud.google.com/gke-spot", "true"),
        ("eks.amazonaws.com/capacityType", "SPOT"),
    ],
)
def test_a_clouds_capacity_label_among_the_tasks_node_labels_is_its_choice_too(
    spot_ratio: None, cloud_label: tuple[str, str]
) -> None:
    # Urgent work would get on-demand, which no node with the cloud's spot label is: unplaceable.
    request = GpuRequest(gpus=1, priority=100, node_labels=(cloud_label,))
    assert with_capacity(request, None, checkpointed=False, expected_seconds=None) == request


def test_the_operator_pins_its_request_to_the_capacity_it_names() -> None:
    op = GpuPodOperator(task_id="t", image="i", gpus=1, capacity="spot")
    assert op.gpu_request().node_labels == (SPOT,)
    urgent = GpuPodOperator(task_id="u", image="i", gpus=1, priority=200)
    assert urgent.gpu_request().node_labels == (ON_DEMAND,)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        pytest.param({"capacity": "cheap"}, "capacity", id="capacity"),
        pytest.param({"expected_duration": -5}, "expected_duration", id="expected_duration"),
    ],
)
def test_bad_capacity_arguments_fail_at_parse_time(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        GpuPodOperator(task_id="t", image="i", gpus=1, **kwargs)  # type: ignore[arg-type]
    assert raised.value.field == field


@pytest.mark.parametrize("ratio", ["cheap", "0", "1.5", "nan"])
def test_a_bad_spot_price_ratio_is_a_configuration_error(ratio: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__SPOT_PRICE_RATIO", ratio)
    with pytest.raises(ConfigurationError, match="spot_price_ratio"):
        with_capacity(TRAINING, None, checkpointed=True, expected_seconds=60)


@pytest.mark.parametrize(
    ("ratio", "kwargs", "matters"),
    [
        pytest.param("0.5", {}, True, id="between-the-ratios"),
        pytest.param("0.3", {}, False, id="cheap-spot-whatever-the-length"),
        pytest.param("0.7", {}, False, id="dear-spot-whatever-the-length"),
        pytest.param("", {}, False, id="price-unknown"),
        pytest.param("0.5", {"priority": 100}, False, id="urgent"),
        pytest.param("0.5", {"preemptible": False}, False, id="not-preemptible"),
    ],
)
def test_the_length_of_a_run_matters_only_between_the_two_ratios(
    ratio: str, kwargs: dict[str, object], matters: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_gpupool.operators.capacity import duration_matters

    monkeypatch.setenv("AIRFLOW__GPUPOOL__SPOT_PRICE_RATIO", ratio)
    request = GpuRequest(**{"gpus": 1, "workload_class": "training", "preemptible": True, **kwargs})  # type: ignore[arg-type]
    assert duration_matters(request, None, checkpointed=True) is matters
    assert duration_matters(request, Capacity.ANY, checkpointed=True) is False  # the task chose


def test_without_expected_duration_the_task_takes_its_recent_successful_runs(
    tmp_path: Path, spot_ratio: None
) -> None:
    from airflow_gpupool.hooks import GpuPoolHook
    from airflow_gpupool.ledger import Ledger
    from airflow_gpupool.task_try import TaskTry
    from tests.ledger_fixtures import node

    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger.create(url) as ledger:
        ledger.upsert_nodes([node("n1", gpus=1)])
    op = GpuPodOperator(
        task_id="fit", image="i", gpus=1, workload_class="training", preemptible=True, checkpoint_dir="/ckpt"
    )
    op.__dict__["gpu_hook"] = GpuPoolHook(None, ledger_url=url)  # the connection's ledger
    this = TaskTry("retrain", "fit", "manual__2", -1, 1, "w")

    op._learn_typical_run(this)
    assert op.gpu_request().prefer_node_labels == ()  # no run yet: taken as long, 0.5 is too dear for that

    earlier = TaskTry("retrain", "fit", "manual__1", -1, 1, "w")
    op.gpu_hook.reserve(GpuRequest(gpus=1), earlier.holder, reservation_id=earlier.reservation_id)
    op.gpu_hook.release(earlier.reservation_id, "pod succeeded")
    op._learn_typical_run(this)
    assert op.gpu_request().prefer_node_labels == (SPOT,)  # a short run: 0.5 is cheap enough
    op.gpu_hook.close()
