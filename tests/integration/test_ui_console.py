"""The console's actions through the plugin app, on SQLite and PostgreSQL, with Airflow's real auth manager.

Login is Airflow's job (the user is given, as in test_ui_plugin); whether that user may act is
asked of the real simple auth manager: ``viewer`` is refused with 403 and nothing changes,
``admin`` acts, and the ledger's history names the admin.
"""

from __future__ import annotations

import html
from collections.abc import Iterator

import pytest
from airflow.api_fastapi.app import create_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient

from airflow_gpupool.exceptions import GrantPreemptedError
from airflow_gpupool.ledger import Ledger, LedgerActions, LedgerHistory, ReservationState
from airflow_gpupool.plugins.app import create_app
from airflow_gpupool.plugins.console.guard import form_token
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node

ADMIN = SimpleAuthManagerUser(username="ada", role="admin")
VIEWER = SimpleAuthManagerUser(username="vic", role="viewer")


@pytest.fixture
def pool(ledger: Ledger) -> Ledger:
    """Two GPUs of team vision granted (one bound to a pod), two of its requests waiting."""
    create_auth_manager()
    ledger.upsert_nodes([node("a1", gpus=2, pool="a100")])
    ledger.reserve(GpuRequest(gpus=1, team="vision"), "h-g1", reservation_id="g1", ttl=3600)
    ledger.reserve(GpuRequest(gpus=1, team="vision"), "h-g2", reservation_id="g2", ttl=3600)
    ledger.bind("g2", namespace="default", name="train-pod")
    ledger.reserve(GpuRequest(gpus=1, team="vision"), "h-w1", reservation_id="w1", timeout=3600)
    ledger.reserve(GpuRequest(gpus=1, team="vision"), "h-w2", reservation_id="w2", timeout=3600)
    return ledger


def client_as(ledger: Ledger, user: SimpleAuthManagerUser) -> TestClient:
    app = create_app(lambda: ledger, snapshot_ttl=0)
    app.dependency_overrides[get_user] = lambda: user
    return TestClient(app, follow_redirects=False)


@pytest.fixture
def admin(pool: Ledger) -> Iterator[TestClient]:
    yield client_as(pool, ADMIN)


@pytest.fixture
def viewer(pool: Ledger) -> Iterator[TestClient]:
    yield client_as(pool, VIEWER)


def post(client: TestClient, user: SimpleAuthManagerUser, action: str, **form: str) -> object:
    return client.post(f"/actions/{action}", data={"csrf": form_token(user), **form})


ACTIONS = [
    ("cancel", {"target": "w1"}),
    ("release", {"target": "g1", "confirm": "yes"}),
    ("priority", {"target": "w2", "priority": "7"}),
    ("cordon", {"target": "a1", "team": "vision"}),
    ("drain", {"target": "a1", "team": "vision"}),
    ("uncordon", {"target": "a1", "team": "vision"}),
]


@pytest.mark.parametrize(("action", "form"), ACTIONS, ids=[a for a, _ in ACTIONS])
def test_a_viewer_is_refused_every_action_and_nothing_changes(
    pool: Ledger, viewer: TestClient, action: str, form: dict[str, str]
) -> None:
    before = pool.snapshot()
    response = post(viewer, VIEWER, action, **form)
    assert response.status_code == 403
    assert "vic may not act on the GPU pool" in response.text
    after = pool.snapshot()
    assert [(r.id, r.state, r.request.priority) for r in after.grants + after.queue] == [
        (r.id, r.state, r.request.priority) for r in before.grants + before.queue
    ]
    assert [n.health for n in after.nodes] == ["healthy"]
    assert LedgerActions(pool).entries() == []


def test_an_admin_cancels_a_waiting_request_and_the_history_names_her(
    pool: Ledger, admin: TestClient
) -> None:
    response = post(admin, ADMIN, "cancel", target="w1")
    assert response.status_code == 303
    assert response.headers["location"].startswith("/teams/vision?done=cancelled+waiting+request+w1")
    assert pool.get("w1").state is ReservationState.CANCELLED
    [entry] = [e for e in LedgerHistory(pool).entries() if e.id == "w1"]
    assert entry.message == "cancelled by ada in the GPU pool console"
    [done] = LedgerActions(pool).entries("vision")
    assert (done.actor, done.action, done.target) == ("ada", "cancel", "w1")


def test_a_release_needs_its_confirmation_which_states_the_pods_fate(pool: Ledger, admin: TestClient) -> None:
    page = admin.get("/reservations/g2/release")
    assert page.status_code == 200
    assert "Pod default/train-pod runs on this grant" in page.text
    assert "passes on only once the pod is gone" in page.text
    assert 'name="confirm" value="yes"' in page.text
    unconfirmed = post(admin, ADMIN, "release", target="g2")
    assert unconfirmed.status_code == 400
    assert "confirm the release of g2 first" in unconfirmed.text
    assert pool.get("g2").state is ReservationState.GRANTED
    assert pool.get("g2").preempt_deadline is None
    assert post(admin, ADMIN, "release", target="g2", confirm="yes").status_code == 303
    # Its pod runs: the grant is revoked as a preemption victim, the slice still held for the pod.
    revoked = pool.get("g2")
    assert revoked.state is ReservationState.PREEMPTING
    assert revoked.preempt_deadline is not None
    assert revoked.message.startswith("revoked by ada in the GPU pool console: ")
    assert pool.get("w1").state is ReservationState.WAITING
    with pytest.raises(GrantPreemptedError):
        pool.renew("g2")
    # Its task, told so, deletes the pod and gives the slice back: the head of the queue gets it.
    pool.release("g2")
    assert pool.get("w1").state is ReservationState.GRANTED


def test_a_release_of_a_grant_without_a_pod_frees_it_at_once(pool: Ledger, admin: TestClient) -> None:
    assert "No pod is bound to this grant yet" in admin.get("/reservations/g1/release").text
    assert post(admin, ADMIN, "release", target="g1", confirm="yes").status_code == 303
    assert pool.get("g1").state is ReservationState.RELEASED
    assert pool.get("g1").message == "revoked by ada in the GPU pool console"
    assert pool.get("w1").state is ReservationState.GRANTED


def test_priority_changes_within_the_range_and_reorders_the_queue(pool: Ledger, admin: TestClient) -> None:
    assert pool.queue_positions() == {"w1": 1, "w2": 2}
    assert post(admin, ADMIN, "priority", target="w2", priority="7").status_code == 303
    assert pool.queue_positions() == {"w2": 1, "w1": 2}
    assert pool.get("w2").request.priority == 7
    [done] = LedgerActions(pool).entries("vision")
    assert (done.actor, done.detail) == ("ada", "priority of w2 changed from 0 to 7")
    # The next free GPU goes by the new order.
    pool.release("g1")
    assert pool.get("w2").state is ReservationState.GRANTED


@pytest.mark.parametrize(("value", "status"), [("100", 422), ("-1", 422), ("ten", 422), ("", 422)])
def test_a_priority_outside_the_range_is_refused_naming_it(
    pool: Ledger, admin: TestClient, value: str, status: int
) -> None:
    response = post(admin, ADMIN, "priority", target="w2", priority=value)
    assert response.status_code == status
    assert "give a whole number from 0 to 99 (urgent work starts at 100)" in response.text
    assert pool.get("w2").request.priority == 0


def test_wrong_states_and_unknown_targets_are_refused_plainly(pool: Ledger, admin: TestClient) -> None:
    cases = [
        ("cancel", {"target": "g1"}, 409, "reservation g1 is granted, not waiting"),
        ("release", {"target": "w1", "confirm": "yes"}, 409, "reservation w1 is waiting"),
        (
            "priority",
            {"target": "g1", "priority": "3"},
            409,
            "reservation g1 is granted, not waiting: only a waiting request",
        ),
        ("cancel", {"target": "nope"}, 404, "no reservation 'nope'"),
        ("cordon", {"target": "nope", "team": "vision"}, 404, "no node 'nope'"),
        ("cordon", {"target": "a1"}, 422, "team is missing"),
        ("explode", {"target": "a1"}, 404, "no console action 'explode'"),
    ]
    for action, form, status, text in cases:
        response = post(admin, ADMIN, action, **form)
        assert (response.status_code, text in html.unescape(response.text)) == (status, True), action
    assert LedgerActions(pool).entries() == []


def test_cordon_drain_uncordon_a_node(pool: Ledger, admin: TestClient) -> None:
    for action, health in (("cordon", "cordoned"), ("uncordon", "healthy"), ("drain", "draining")):
        assert post(admin, ADMIN, action, target="a1", team="vision").status_code == 303
        [a1] = pool.snapshot().nodes
        assert a1.health == health
    assert a1.health_reason == "drain by ada in the GPU pool console"
    assert [a.action for a in LedgerActions(pool).entries("vision")] == ["drain", "uncordon", "cordon"]


def test_a_cookie_post_without_the_form_token_or_from_another_site_is_refused(
    pool: Ledger, admin: TestClient
) -> None:
    assert admin.post("/actions/cancel", data={"target": "w1"}).status_code == 403
    assert admin.post("/actions/cancel", data={"target": "w1", "csrf": "0" * 64}).status_code == 403
    cross = admin.post(
        "/actions/cancel",
        data={"target": "w1", "csrf": form_token(ADMIN)},
        headers={"Sec-Fetch-Site": "cross-site"},
    )
    assert cross.status_code == 403
    assert pool.get("w1").state is ReservationState.WAITING


def test_the_team_page_shows_forms_to_an_admin_only(
    pool: Ledger, admin: TestClient, viewer: TestClient
) -> None:
    mine = admin.get("/teams/vision")
    theirs = viewer.get("/teams/vision")
    assert mine.status_code == theirs.status_code == 200
    assert mine.text.count('<form class="act"') == 2 * 2 + 2  # priority and cancel per waiter; cordon, drain
    assert '<form class="act"' not in theirs.text
    assert "You may look but not act: acting needs edit permission on Pools" in theirs.text
    for rid in ("g1", "g2", "w1", "w2"):
        assert f'href="../reservations/{rid}"' in mine.text
    assert viewer.get("/reservations/g2/release").status_code == 403


def test_the_overview_links_teams_and_queue_ids(pool: Ledger, viewer: TestClient) -> None:
    page = viewer.get("/").text
    assert 'href="teams/vision"' in page
    assert 'href="reservations/w1"' in page and 'href="reservations/w2"' in page


def test_the_team_page_draws_its_use_against_its_nominal_quota(pool: Ledger, viewer: TestClient) -> None:
    from airflow_gpupool.governance.quotas import parse_quota_file
    from airflow_gpupool.ledger import LedgerQuotas

    plan = {"teams": [{"name": "vision", "quotas": [{"flavor": {"pool": "a100"}, "nominal": 1}]}]}
    LedgerQuotas(pool).apply(parse_quota_file(plan))
    page = html.unescape(viewer.get("/teams/vision").text)
    assert "GPUs held, peak 2 · nominal 1 GPUs (dashed)" in page
    quotas = page.split('<table class="quotas">')[1].split("</table>")[0]
    assert "a100" in quotas
    assert "<td>1</td><td>2</td><td>1</td>" in quotas  # nominal, held, borrowed
