"""Fuzz: the public Python API takes valid arguments or refuses them with a typed error, at once.

``GpuPodOperator`` and ``GpuJobOperator`` constructors (what a DAG file runs when it is parsed),
``GpuRequest`` and the container resources it is read from, and ``Ledger.reserve`` on SQLite and
PostgreSQL. A refusal is a :class:`GpuPoolError` (never a ``TypeError`` or ``KeyError`` from
inside), a value the API must refuse is never taken, and a refused reserve leaves every row of
every table as it was.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.client import V1ResourceRequirements

from airflow_gpupool.exceptions import GpuPoolError
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.operators import GpuJobOperator, GpuPodOperator
from airflow_gpupool.resources import GpuRequest
from tests.integration.fuzz_fixtures import LedgerRows

NAN, INF = math.nan, math.inf


def arg(valid: list[Any], invalid: list[Any]) -> st.SearchStrategy[tuple[Any, bool]]:
    """Draw ``(value, valid)`` from values the API must take and values it must refuse."""
    return st.sampled_from([(v, True) for v in valid] + [(v, False) for v in invalid])


SECONDS = arg([60, 3600.0, timedelta(minutes=5)], [0, -1, NAN, INF, "soon", True])
REQUEST_ARGS: dict[str, st.SearchStrategy[tuple[Any, bool]]] = {
    "gpus": arg([1, 2, 8], [-1, 1.5, "2", NAN, True]),
    "gpu_milli": arg([250, 999], [0, 1000, -5, 2.5, "250"]),
    "gpu_memory_mib": arg([1024], [0, -1, "x", 1.5]),
    "mig_profile": arg(["1g.10gb", "3g.40gb"], ["9g.9gb", "", 5]),
    "gpu_models": arg([("A100",), ["A100", "H100"], "A100|H100"], [[""], [5], 5]),
    "node_labels": arg([{"zone": "a"}, None], [{"": "v"}, "zone=a", {"zone": 5}, ["zone"]]),
    "priority": arg([0, 100, -5], [1.5, "high", NAN, True]),
    "team": arg(["vision"], ["", 5, None]),
}
OPERATOR_ARGS: dict[str, st.SearchStrategy[tuple[Any, bool]]] = {
    **REQUEST_ARGS,
    # Templated fields render to text: an operator reads "2" as 2 (a GpuRequest does not).
    "gpus": arg([1, 2, 8, "2"], [-1, 1.5, "two", NAN, True]),
    "gpu_milli": arg([250, 999, "250"], [0, 1000, -5, 2.5, "1/4"]),
    "workload_class": arg(["training", "inference", "batch"], ["gaming", "", 5]),
    "preemptible": arg([True, False], ["yes", 1.5]),
    "reservation_timeout": SECONDS,
    "lease_ttl": SECONDS,
}
POD_ARGS = {
    **OPERATOR_ARGS,
    "capacity": arg(["on-demand", "spot", "any", None], ["cheap", "", 5]),
    "preemption_grace_seconds": arg([30, None], [-1, NAN, "x"]),
    "keep_checkpoints": arg([1, 5], [-1, 1.5, "5"]),
    "log_tail_lines": arg([50, 0], [-1, "x"]),
    "shm_size": arg(["1Gi", "512Mi", None], ["lots", -1, "1Gi of it"]),
    "expected_duration": arg([60, None], [-1, NAN, INF, "x"]),
    "hand_on": arg([True, False], ["yes", 1, None]),
    "handoff_seconds": arg([30, 600, None], [0, -1, NAN, INF, "x"]),
    "container_resources": arg(
        [V1ResourceRequirements(requests={"cpu": "2", "memory": "4Gi"}), None],
        [
            V1ResourceRequirements(requests={"cpu": "lots"}),
            V1ResourceRequirements(requests={"memory": "-1Gi"}),
        ],
    ),
}
JOB_ARGS = {**OPERATOR_ARGS, "members": arg([1, 2, 4], [0, -1, 1.5, "two"])}
SETTINGS = settings(max_examples=150, deadline=None)


def _chosen(
    table: dict[str, st.SearchStrategy[tuple[Any, bool]]],
) -> st.SearchStrategy[dict[str, tuple[Any, bool]]]:
    names = sorted(table)
    return st.sets(st.sampled_from(names), max_size=4).flatmap(
        lambda keys: st.fixed_dictionaries({k: table[k] for k in sorted(keys)})
    )


def _judge(build: Any, drawn: dict[str, tuple[Any, bool]]) -> None:
    kwargs = {k: v for k, (v, _) in drawn.items()}
    invalid = sorted(k for k, (_, ok) in drawn.items() if not ok)
    try:
        build(**kwargs)
    except GpuPoolError as e:
        assert str(e), kwargs
        return
    except Exception as e:  # the assertion names what leaked
        raise AssertionError(f"{kwargs}: {type(e).__name__} instead of a typed error: {e}") from e
    assert not invalid, f"{kwargs}: {invalid} taken"


@SETTINGS
@given(drawn=_chosen(POD_ARGS), gpus=st.sampled_from([{"gpus": 1}, {"gpu_milli": 500}]))
def test_gpu_pod_operator_arguments_are_taken_or_refused_at_parse_time(
    drawn: dict[str, tuple[Any, bool]], gpus: dict[str, int]
) -> None:
    base = {k: (v, True) for k, v in gpus.items() if k not in drawn}
    _judge(lambda **kw: GpuPodOperator(task_id="train", image="busybox", **kw), {**base, **drawn})


@SETTINGS
@given(drawn=_chosen(JOB_ARGS))
def test_gpu_job_operator_arguments_are_taken_or_refused_at_parse_time(
    drawn: dict[str, tuple[Any, bool]],
) -> None:
    base = {"members": (2, True), "gpus": (1, True)}
    _judge(lambda **kw: GpuJobOperator(task_id="sweep", image="busybox", **kw), {**base, **drawn})


@SETTINGS
@given(drawn=_chosen(REQUEST_ARGS))
def test_a_gpu_request_is_built_or_refused_typed(drawn: dict[str, tuple[Any, bool]]) -> None:
    names = {"gpu_models": "gpu_models", "node_labels": "node_labels"}
    _judge(lambda **kw: GpuRequest(**{names.get(k, k): v for k, v in kw.items()}), drawn)


RESERVE_ARGS = {
    "request": arg([GpuRequest(gpus=1), GpuRequest(gpu_milli=250)], [None, "gpu", {"gpus": 1}]),
    "holder": arg(["fuzz-holder"], ["", None, 5, "h" * 600]),
    "ttl": arg([None, 60, 1.5], [0, -1, NAN, INF, 1e300, "60", True]),
    "timeout": arg([None, 60], [0, -1, NAN, INF, 1e300, "60"]),
    "reservation_id": arg([None, "fuzz-a"], ["", "x" * 65, 5]),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    drawn=st.fixed_dictionaries({k: RESERVE_ARGS[k] for k in ("request", "holder")}).flatmap(
        lambda base: _chosen({k: RESERVE_ARGS[k] for k in ("ttl", "timeout", "reservation_id")}).map(
            lambda d: {**base, **d}
        )
    )
)
def test_a_reserve_is_granted_or_refused_with_the_ledger_unchanged(
    drawn: dict[str, tuple[Any, bool]], fuzz_url: str, fuzz_rows: LedgerRows
) -> None:
    kwargs = {k: v for k, (v, _) in drawn.items()}
    invalid = sorted(k for k, (_, ok) in drawn.items() if not ok)
    before = fuzz_rows.dump()
    ledger = Ledger(fuzz_url)
    try:
        reservation = ledger.reserve(kwargs.pop("request"), kwargs.pop("holder"), **kwargs)
    except GpuPoolError:
        assert fuzz_rows.dump() == before, f"{drawn} was refused but changed the ledger"
        return
    except Exception as e:
        raise AssertionError(f"{drawn}: {type(e).__name__} instead of a typed error: {e}") from e
    else:
        ledger.release(reservation.id, reason="fuzz")
        assert not invalid, f"{drawn}: {invalid} taken"
    finally:
        ledger.close()
