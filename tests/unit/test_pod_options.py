"""A gated pod's own options: where its priority comes from, and its promise to checkpoint on SIGTERM (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.labels import CHECKPOINT_ON_SIGTERM_KEY, PRIORITY_CLASS_ANNOTATION, PRIORITY_KEY
from airflow_gpupool.pod_options import (
    check_sigterm_promise,
    checkpointed,
    priority_class_of,
    sigterm_promise,
)

CKPT_ENV = [{"name": "GPUPOOL_CHECKPOINT_DIR", "value": "s3://ckpt/run"}]


def pod(
    *,
    priority_class: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "base", "env": env or []}]}
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    return {"metadata": {"labels": labels or {}, "annotations": annotations or {}}, "spec": spec}


PRIORITY_SOURCES = [
    # (pod, its parsed request annotation, the class its priority comes from)
    pytest.param(pod(), {}, None, id="no class"),
    pytest.param(pod(priority_class="high"), {}, "high", id="a class and nothing else"),
    pytest.param(pod(priority_class="high", labels={PRIORITY_KEY: "5"}), {}, None, id="own label wins"),
    pytest.param(
        pod(priority_class="high", annotations={PRIORITY_KEY: "5"}), {}, None, id="own annotation wins"
    ),
    pytest.param(pod(priority_class="high"), {"priority": 5}, None, id="own request priority wins"),
    pytest.param(
        # the hook's own earlier verdict: the request it wrote then carries the default priority
        pod(priority_class="high", annotations={PRIORITY_CLASS_ANNOTATION: "high"}),
        {"priority": 0},
        "high",
        id="gated before by the hook",
    ),
    pytest.param(
        pod(priority_class="low", annotations={PRIORITY_CLASS_ANNOTATION: "high", PRIORITY_KEY: "0"}),
        {},
        None,
        id="a stale mark for another class is not the hook's verdict",
    ),
]


@pytest.mark.parametrize(("p", "asked", "expected"), PRIORITY_SOURCES)
def test_where_the_priority_comes_from(
    p: dict[str, Any], asked: dict[str, Any], expected: str | None
) -> None:
    assert priority_class_of(p, asked) == expected


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        pytest.param(pod(), None, id="nothing said"),
        pytest.param(pod(annotations={CHECKPOINT_ON_SIGTERM_KEY: "true"}), True, id="annotation"),
        pytest.param(pod(labels={CHECKPOINT_ON_SIGTERM_KEY: "True"}), True, id="label, any case"),
        pytest.param(pod(annotations={CHECKPOINT_ON_SIGTERM_KEY: " false "}), False, id="false"),
    ],
)
def test_the_sigterm_promise_is_read(p: dict[str, Any], expected: bool | None) -> None:
    assert sigterm_promise(p) is expected


def test_a_malformed_sigterm_promise_is_refused_naming_it() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        sigterm_promise(pod(annotations={CHECKPOINT_ON_SIGTERM_KEY: "yes"}))
    assert caught.value.field == CHECKPOINT_ON_SIGTERM_KEY and caught.value.value == "yes"


def test_a_promise_needs_somewhere_to_write_the_checkpoint() -> None:
    check_sigterm_promise(True, pod(env=CKPT_ENV))
    check_sigterm_promise(False, pod())
    secret = [{"name": "GPUPOOL_CHECKPOINT_DIR", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    check_sigterm_promise(True, pod(env=secret))
    for env in ([], [{"name": "GPUPOOL_CHECKPOINT_DIR", "value": ""}], [{"name": "CKPT", "value": "/c"}]):
        assert not checkpointed(pod(env=env))
        with pytest.raises(InvalidRequestError) as caught:
            check_sigterm_promise(True, pod(env=env))
        assert caught.value.field == "checkpoint_on_sigterm"
        assert "GPUPOOL_CHECKPOINT_DIR" in caught.value.expected
