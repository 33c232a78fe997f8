"""A reservation's page and the "GPU reservation" extra link that opens it (issue 15)."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient

from airflow_gpupool.operators import GpuPodOperator
from airflow_gpupool.operators.links import GpuReservationLink
from airflow_gpupool.plugins.app import create_app
from airflow_gpupool.task_try import TaskTry
from tests.unit.metrics.scenario import Pool, build_pool


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    built = build_pool(f"sqlite:///{tmp_path_factory.mktemp('reservation')}/ledger.db")
    yield built
    built.ledger.close()


@pytest.fixture
def client(pool: Pool) -> TestClient:
    app = create_app(lambda: pool.ledger)
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer", role="viewer")
    return TestClient(app)


def test_a_granted_reservation_says_where_it_runs_and_for_how_long(client: TestClient) -> None:
    html = client.get("/reservations/r-train").text
    assert "<dt>Ran on</dt><dd>a100-1 (node pool train), GPU 0</dd>" in html
    assert "<dt>Waited</dt><dd>0s</dd>" in html
    assert "<dt>Held</dt><dd>2m 0s so far</dd>" in html  # granted 120 s before the scenario's "now"
    assert 'data-airflow-link href="/dags/train_dag/runs/' in html
    assert "<html" not in client.get("/reservations/r-train", params={"partial": 1}).text


def test_an_ended_reservation_says_why(client: TestClient) -> None:
    html = client.get("/reservations/r-timed_out").text
    assert "<dt>State</dt><dd>timed_out</dd>" in html
    assert "<dt>Waited</dt><dd>20s</dd>" in html
    assert "<dt>Ran on</dt><dd>not granted</dd>" in html
    assert "<dt>Why</dt><dd>" in html


def test_a_waiting_reservation_says_what_blocks_it(client: TestClient) -> None:
    html = client.get("/reservations/r-wide").text
    assert "<dt>State</dt><dd>waiting</dd>" in html
    assert "needs 2 free GPUs" in html


def test_an_unknown_reservation_is_a_404(client: TestClient) -> None:
    response = client.get("/reservations/nope")
    assert response.status_code == 404 and "no reservation nope" in response.text


def test_the_extra_link_opens_the_page_of_the_tries_own_reservation() -> None:
    (link,) = [x for x in GpuPodOperator.operator_extra_links if isinstance(x, GpuReservationLink)]
    assert link.name == "GPU reservation"
    key = SimpleNamespace(dag_id="train_dag", task_id="fit", run_id="manual__1", map_index=-1, try_number=2)
    ti = SimpleNamespace(**vars(key), start_date=datetime.datetime.now(tz=datetime.UTC))
    expected = TaskTry.from_context({"ti": ti}).reservation_id  # what the operator reserves under
    assert link.get_link(None, ti_key=key) == f"/gpupool/reservations/{expected}"  # type: ignore[arg-type]
