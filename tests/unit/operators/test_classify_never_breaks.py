"""Classification runs inside ``cleanup``: whatever the API returns, it gives a class, never an error."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_gpupool.operators.failures import Classification, FailureClass, classify, read_failure

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
#: Pods shaped almost right: the keys classify reads, with values of any type.
POD_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "metadata": JSON | st.fixed_dictionaries({"name": JSON}),
        "status": JSON
        | st.fixed_dictionaries(
            {},
            optional={
                "phase": JSON,
                "reason": JSON,
                "conditions": JSON,
                "containerStatuses": JSON
                | st.lists(st.fixed_dictionaries({"name": JSON, "state": JSON}), max_size=2),
            },
        ),
    },
)


@given(pod=JSON | POD_LIKE, events=st.lists(JSON, max_size=3) | JSON, tail=JSON)
def test_any_response_gives_a_class(pod: Any, events: Any, tail: Any) -> None:
    result = classify(pod, events, tail)
    assert isinstance(result, Classification) and isinstance(result.failure_class, FailureClass)


@pytest.mark.parametrize("pod", ["Failure", ["a", "list"], 42, b"bytes"])
def test_an_unexpected_type_is_unknown_and_logged(pod: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="airflow_gpupool.operators.failures"):
        result = classify(pod)
    assert result.failure_class is FailureClass.UNKNOWN
    assert "Could not classify the failed pod" in caplog.text


class BrokenManager:
    """A pod manager whose every read fails: the API server went away during cleanup."""

    def read_pod(self, pod: Any) -> Any:
        raise ConnectionError("API server gone")

    def read_pod_events(self, pod: Any) -> Any:
        raise ConnectionError("API server gone")


class BrokenClient:
    def read_namespaced_pod_log(self, **kwargs: Any) -> Any:
        raise ConnectionError("API server gone")


def test_read_failure_survives_every_read_failing_and_an_odd_last_state() -> None:
    operator = SimpleNamespace(
        pod_manager=BrokenManager(),
        client=BrokenClient(),
        base_container_name="base",
        log_tail_lines=50,
        log=logging.getLogger("test-read-failure"),
    )
    pod = SimpleNamespace(metadata=SimpleNamespace(name="train-1", namespace="default"))
    # The last known state is not a Kubernetes model at all.
    classification, tail = read_failure(operator, pod, object())
    assert (classification.failure_class, tail) == (FailureClass.UNKNOWN, "")
