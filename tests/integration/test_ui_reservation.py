"""A reservation's page and the "GPU reservation" extra link that opens it (issue 15)."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient

from airflow_gpupool.ledger import Ledger
from airflow_gpupool.operators import GpuPodOperator
from airflow_gpupool.operators.links import GpuReservationLink
from airflow_gpupool.plugins.app import create_app
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.task_try import TaskTry
from tests.ledger_fixtures import node
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
    url = link.get_link(None, ti_key=key)  # type: ignore[arg-type]
    assert url == f"/gpupool/reservations/{expected}?try=train_dag%2Ffit%2Fmanual__1%2Fmap--1%2Ftry-2"


def test_the_extra_link_of_a_retry_that_adopted_a_grant_opens_the_adopted_reservation(tmp_path: Path) -> None:
    ledger = Ledger.create(f"sqlite:///{tmp_path}/ledger.db", policy="bestfit")
    ledger.upsert_nodes([node("a100-1", gpus=1, model="A100", pool="train")])
    first = TaskTry("adopt_dag", "fit", "manual__1", -1, 1, "w1")
    ledger.reserve(GpuRequest(gpus=1), first.holder, ttl=600, reservation_id=first.reservation_id)
    retry = TaskTry("adopt_dag", "fit", "manual__1", -1, 2, "w2")
    ledger.adopt(first.reservation_id, retry.holder)  # what operators/retries/reattach.py does
    app = create_app(lambda: ledger)
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer", role="viewer")
    client = TestClient(app)
    key = SimpleNamespace(dag_id="adopt_dag", task_id="fit", run_id="manual__1", map_index=-1, try_number=2)
    url = GpuReservationLink().get_link(None, ti_key=key)  # type: ignore[arg-type]
    assert url.startswith(f"/gpupool/reservations/{retry.reservation_id}?")
    html = client.get(url.removeprefix("/gpupool")).text
    assert f"Reservation <code>{first.reservation_id}</code>" in html
    assert "Try 2 re-attached to the pod of an earlier try and adopted its grant" in html
    # Without the try, the retry's own id is still unknown; a try that holds nothing is too.
    assert client.get(f"/reservations/{retry.reservation_id}").status_code == 404
    other = TaskTry("adopt_dag", "fit", "manual__1", -1, 3)
    missing = client.get(f"/reservations/{other.reservation_id}", params={"try": other.holder.rstrip("@")})
    assert missing.status_code == 404
    ledger.close()
