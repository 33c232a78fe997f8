"""The GPU pool plugin's FastAPI app: its page and JSON API against a real SQLite ledger, and its login.

The authenticated client replaces Airflow's ``get_user`` dependency (the boundary: JWT
validation needs the Airflow metadata DB); the anonymous client goes through the real one.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from pathlib import Path

import pytest
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse
from airflow.api_fastapi.core_api.security import get_user
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from airflow_gpupool.get_provider_info import get_provider_info
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.plugins.app import create_app
from airflow_gpupool.plugins.gpupool import GpuPoolPlugin
from airflow_gpupool.plugins.holders import task_instance_url
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.task_try import TaskTry as TaskRef
from airflow_gpupool.task_try import parse_holder
from tests.unit.metrics.scenario import EMBED_HOLDER, TRAIN_HOLDER, Pool, build_pool

TRAIN_URL = "/dags/train_dag/runs/manual__2027-01-15T10%3A00%3A00%2B00%3A00/tasks/fit"
EMBED_URL = "/dags/embed_dag/runs/scheduled__2027-01-15T00%3A00%3A00%2B00%3A00/tasks/embed/mapped/3"


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    built = build_pool(f"sqlite:///{tmp_path_factory.mktemp('ui')}/ledger.db")
    yield built
    built.ledger.close()


@pytest.fixture(scope="module")
def app(pool: Pool) -> FastAPI:
    return create_app(lambda: pool.ledger)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer", role="viewer")
    try:
        yield TestClient(app)
    finally:
        app.dependency_overrides.clear()


@pytest.mark.parametrize(
    "path",
    ["/", "/api/v1/snapshot", "/api/v1/history", "/api/v1/series", "/api/v1/explain/r-wide", "/metrics"],
)
def test_anonymous_requests_are_refused(app: FastAPI, path: str) -> None:
    response = TestClient(app).get(path)
    assert response.status_code == 401
    assert response.json() == {"detail": "Not authenticated"}


def test_the_mounted_plugin_app_refuses_anonymous_requests_too() -> None:
    root = FastAPI()
    for sub in GpuPoolPlugin.fastapi_apps:
        root.mount(sub["url_prefix"], sub["app"])
    response = TestClient(root).get("/gpupool/api/v1/snapshot")
    assert response.status_code == 401


def test_the_plugin_is_registered_with_airflow() -> None:
    assert get_provider_info()["plugins"] == [
        {"name": "gpupool", "plugin-class": "airflow_gpupool.plugins.gpupool.GpuPoolPlugin"}
    ]
    points = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="airflow.plugins")}
    assert points.get("gpupool") == "airflow_gpupool.plugins.gpupool:GpuPoolPlugin"
    [view] = GpuPoolPlugin.external_views
    assert ExternalViewResponse(**view).href == "/gpupool/"
    assert [a["url_prefix"] for a in GpuPoolPlugin.fastapi_apps] == ["/gpupool"]


def test_page_shows_every_node_gpu_and_slice_with_links(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    html = response.text
    for name in ("a100-1", "a100-mig", "t4-1"):
        assert f'data-node="{name}"' in html
    assert 'class="node health-quarantined" data-node="t4-1"' in html
    assert html.count('class="gpu"') == 4
    assert f'href="{TRAIN_URL}"' in html
    assert f'href="{EMBED_URL}"' in html
    assert 'data-reservation="r-mig"' in html and "MIG 3g.40gb" in html
    assert "needs 2 free GPUs, 0 free of 2" in html  # why r-wide waits, from Ledger.explain
    assert "lease expired without renewal" in html  # recent history
    assert "<svg" in html and 'class="alloc"' in html
    partial = client.get("/", params={"partial": 1}).text
    assert "<html" not in partial and 'data-node="a100-1"' in partial


def test_snapshot_api(client: TestClient, pool: Pool) -> None:
    data = client.get("/api/v1/snapshot").json()
    assert [n["name"] for n in data["nodes"]] == ["a100-1", "a100-mig", "t4-1"]
    assert sorted(g["id"] for g in data["grants"]) == ["r-embed", "r-mig", "r-train"]
    assert [q["id"] for q in data["queue"]] == ["r-wide", "r-wide2"]
    assert data["queue"][0]["why"] == pool.ledger.explain("r-wide")
    assert data["fragmentation"] == pytest.approx(1050 / 4000)
    assert data["allocation"] == pytest.approx((1250 + 429) / 4000)


def test_history_api_filters_by_state(client: TestClient) -> None:
    everything = client.get("/api/v1/history", params={"limit": 100}).json()
    assert len(everything["reservations"]) == 9 and everything["total"] == 9
    expired = client.get("/api/v1/history", params={"state": "expired"}).json()["reservations"]
    assert [r["id"] for r in expired] == ["r-expired"]
    assert expired[0]["outcome"] == "expired" and expired[0]["dag_id"] == "lost"
    response = client.get("/api/v1/history", params={"state": "bogus"})
    assert response.status_code == 422 and "state" in response.text


def test_history_api_filters_by_team_pool_and_dag_and_pages(client: TestClient) -> None:
    def ids(**params: object) -> list[str]:
        return [r["id"] for r in client.get("/api/v1/history", params=params).json()["reservations"]]

    assert ids(team="nlp") == ["r-mig", "r-embed"]
    assert ids(pool="train") == ["r-embed", "r-train"]
    assert ids(dag_id="embed_dag") == ["r-embed"]
    assert ids(team="vision", state=["waiting"]) == ["r-wide2", "r-wide"]
    assert ids(limit=2, offset=1) == ids(limit=3)[1:]
    train = client.get("/api/v1/history", params={"dag_id": "train_dag"}).json()["reservations"][0]
    assert (train["try_number"], train["pool"], train["held"], train["waited"]) == (1, "train", 120.0, 0.0)


def test_usage_api_per_team_and_pool(client: TestClient) -> None:
    data = client.get("/api/v1/usage", params={"range": "1h"}).json()
    teams = {t["team"]: t["gpu_hours"] for t in data["teams"]}
    # Held for the scenario's last 120 s: vision 1 GPU, nlp 0.25 GPU + a 3g.40gb slice (3/7 of an
    # A100); the expired T4 grant of "default" held its GPU for 20 s, until it was reaped.
    hour = 3600
    assert teams == pytest.approx(
        {"vision": 120 / hour, "nlp": (0.25 + 0.429) * 120 / hour, "default": 20 / hour}
    )
    assert {p["pool"]: p["gpus"] for p in data["pools"]} == {"infer": 1, "mig": 1, "train": 2}
    pools = {p["pool"]: p["gpu_hours"] for p in data["pools"]}
    assert pools == pytest.approx({"infer": 20 / hour, "mig": 0.429 * 120 / hour, "train": 1.25 * 120 / hour})
    assert data["quotas"] == []
    assert client.get("/api/v1/usage", params={"range": "2d"}).status_code == 422


def test_the_page_filters_its_history_and_shows_the_range(client: TestClient) -> None:
    html = client.get("/", params={"team": "nlp", "range": "7d"}).text
    history = html[html.index('<section class="history">') :]
    assert "r-embed" in history and "r-mig" in history and "r-train" not in history
    assert '<option value="nlp" selected>' in history
    assert "Use per team and node pool, last 7d" in html
    assert '<a href="?range=7d&amp;team=nlp" class="range on">7d</a>' in html
    assert "GPU-hours" in html and "What these mean" in html
    assert client.get("/", params={"page": 0}).status_code == 422


def test_series_api_steps_through_grants(client: TestClient, pool: Pool) -> None:
    data = client.get("/api/v1/series", params={"hours": 1}).json()
    assert data["until"] == pool.clock.now
    assert data["allocation"][-1] == [pool.clock.now, pytest.approx(1679 / 4000)]
    # The expired T4 lease held 1000 milli for 10 s, inside the window.
    assert max(v for _, v in data["allocation"]) >= 1000 / 4000
    assert data["fragmentation"][-1][1] == pytest.approx(1050 / 4000)


def test_explain_api(client: TestClient, pool: Pool) -> None:
    assert client.get("/api/v1/explain/r-wide").json() == {
        "id": "r-wide",
        "explanation": pool.ledger.explain("r-wide"),
        "forecast": None,  # no controller has forecast it
    }
    assert client.get("/api/v1/explain/nope").status_code == 404


def test_metrics_under_the_plugin_app(client: TestClient) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    assert families["gpupool_ledger_up"].samples[0].value == 1
    assert {s.labels["state"]: s.value for s in families["gpupool_reservations"].samples if s.name.endswith("_total")} == {
        "cancelled": 1, "expired": 1, "released": 1, "timed_out": 1, "preempted": 0,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("holder", "expected", "url"),
    [
        pytest.param(
            TRAIN_HOLDER,
            TaskRef("train_dag", "fit", "manual__2027-01-15T10:00:00+00:00", -1, 1, "worker-1"),
            TRAIN_URL,
            id="unmapped",
        ),
        pytest.param(
            EMBED_HOLDER,
            TaskRef("embed_dag", "embed", "scheduled__2027-01-15T00:00:00+00:00", 3, 2, "worker-2"),
            EMBED_URL,
            id="mapped",
        ),
        pytest.param(
            "d/t/run/with/slash/map-0/try-1@h",
            TaskRef("d", "t", "run/with/slash", 0, 1, "h"),
            "/dags/d/runs/run%2Fwith%2Fslash/tasks/t/mapped/0",
            id="slash-in-run-id",
        ),  # fmt: skip
        pytest.param("adhoc-notebook@laptop", None, None, id="not-a-task"),
        pytest.param("d/t/run/map-x/try-1@h", None, None, id="bad-map-index"),
    ],
)
def test_parse_holder(holder: str, expected: TaskRef | None, url: str | None) -> None:
    ref = parse_holder(holder)
    assert ref == expected
    if ref is not None:
        assert task_instance_url(ref) == url


@pytest.mark.timeout(120)
def test_a_real_airflow_token_is_accepted_by_header_and_cookie(app: FastAPI, airflow_db: None) -> None:
    from airflow.api_fastapi.app import create_auth_manager

    # The API server's own auth manager (simple, by default) issues and checks the JWT; checking
    # it reads the revoked-token table, hence the migrated Airflow DB.
    token = create_auth_manager().generate_jwt(SimpleAuthManagerUser(username="viewer", role="viewer"))
    client = TestClient(app)
    assert client.get("/api/v1/snapshot", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert client.get("/api/v1/snapshot", headers={"Authorization": "Bearer not-a-jwt"}).status_code == 403
    client.cookies.set("_token", token)  # what the Airflow UI's login leaves in the browser
    assert client.get("/").status_code == 200


def test_an_unreadable_ledger_is_a_503_that_names_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/missing.db"
    broken = create_app(lambda: Ledger(url))
    broken.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer", role="viewer")
    client = TestClient(broken)
    for path in ("/", "/api/v1/snapshot"):
        response = client.get(path)
        assert response.status_code == 503
        assert response.json()["detail"].startswith(f"GPU ledger unavailable: no GPU ledger at {url}")
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and "gpupool_ledger_up 0.0" in metrics.text


def test_a_big_cluster_shows_pools_closed_and_pages_its_tables(tmp_path: Path) -> None:
    from tests.ledger_fixtures import node

    ledger = Ledger.create(f"sqlite:///{tmp_path}/big.db", policy="bestfit")
    ledger.upsert_nodes(
        [node(f"a{i:02}", gpus=1, pool="a100") for i in range(20)]
        + [node(f"t{i:02}", gpus=1, model="T4", pool="t4") for i in range(10)]
    )
    for i in range(140):  # more than the tables show: 30 grants, 110 waiting
        ledger.reserve(GpuRequest(gpus=1), f"job{i}@h", timeout=600)
    app = create_app(lambda: ledger)
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer", role="viewer")
    client = TestClient(app)
    closed = client.get("/", params={"partial": 1}).text
    assert closed.count('class="node ') == 0
    assert '<b>a100</b> <span class="meta">20 nodes · 20 GPUs · 20 held (100%) · 20 grants' in closed
    assert 'href="?range=24h&amp;open=t4">open</a>' in closed
    opened = client.get("/", params={"partial": 1, "open": "t4"}).text
    assert (
        opened.count('class="node ') == 10 and 'data-node="t00"' in opened and 'data-node="a00"' not in opened
    )
    assert 'href="?range=24h">close</a>' in opened
    everything = client.get("/", params={"partial": 1, "open": "*", "rows": "all"}).text
    assert everything.count('class="node ') == 30
    assert "Showing" not in everything and everything.count('<span class="why">') == 110
    assert "Showing 100 of 110" in closed and closed.count('<span class="why">') == 100
    ledger.close()


def test_the_page_the_api_and_the_metrics_share_one_reading_per_process(tmp_path: Path) -> None:
    from tests.ledger_fixtures import node

    ledger = Ledger.create(f"sqlite:///{tmp_path}/cached.db", policy="bestfit")
    ledger.upsert_nodes([node("a1", gpus=2)])
    app = create_app(lambda: ledger, snapshot_ttl=3600)
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer", role="viewer")
    client = TestClient(app)

    def grants_seen() -> tuple[int, int, str]:
        api = len(client.get("/api/v1/snapshot").json()["grants"])
        html = client.get("/", params={"partial": 1}).text
        page = html.split('<section class="grants">')[1].split("</section>")[0].count('<td><a class="rid"')
        metrics = client.get("/metrics").text
        return (
            api,
            page,
            next(line for line in metrics.splitlines() if line.startswith("gpupool_gpu_allocated_milli{")),
        )

    before = grants_seen()
    ledger.reserve(GpuRequest(gpus=1), "job@h")
    assert grants_seen() == before  # served from the one cached reading
    app.state.gpupool.invalidate()
    after = grants_seen()
    assert after[:2] == (1, 1) and after[2] != before[2]
    ledger.close()
