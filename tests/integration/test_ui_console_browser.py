"""The console in a real headless Chromium: an admin opens a team's page and takes every action; a viewer cannot.

Needs Debian's Chromium and the playwright package, as test_ui_browser (skips without them,
fails under CI=true). Whether the user may act is the real simple auth manager's answer.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from airflow.api_fastapi.app import create_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from fastapi import FastAPI

from airflow_gpupool.ledger import Ledger, LedgerActions, ReservationState
from airflow_gpupool.plugins.app import create_app
from airflow_gpupool.resources import GpuRequest
from tests.integration.test_ui_browser import ARTIFACTS, CHROMIUM, _free_port, browser_ready  # noqa: F401
from tests.ledger_fixtures import node

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]


@contextlib.contextmanager
def serve_as(ledger: Ledger, user: SimpleAuthManagerUser) -> Iterator[str]:
    """Serve the plugin app under ``/gpupool`` with ``user`` signed in."""
    create_auth_manager()
    root = FastAPI()
    app = create_app(lambda: ledger, snapshot_ttl=0)
    app.dependency_overrides[get_user] = lambda: user
    root.mount("/gpupool", app)
    port = _free_port()
    uv = uvicorn.Server(
        uvicorn.Config(root, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/gpupool/"
    finally:
        uv.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def pool(browser_ready: None, tmp_path: Path) -> Iterator[Ledger]:  # noqa: F811
    with Ledger.create(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        ledger.upsert_nodes([node("a1", gpus=2, pool="a100")])
        for rid in ("g1", "g2"):
            ledger.reserve(GpuRequest(gpus=1, team="vision"), f"h-{rid}", reservation_id=rid, ttl=3600)
        ledger.bind("g2", namespace="default", name="train-pod")
        for rid in ("w1", "w2", "w3"):
            ledger.reserve(GpuRequest(gpus=1, team="vision"), f"h-{rid}", reservation_id=rid, timeout=3600)
        yield ledger


@pytest.mark.timeout(90)
def test_an_admin_takes_every_action_from_the_team_page(pool: Ledger) -> None:
    from playwright.sync_api import sync_playwright

    with serve_as(pool, SimpleAuthManagerUser(username="ada", role="admin")) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url, wait_until="load")
            page.locator("section.queue a.team-link").first.click()
            page.wait_for_url("**/gpupool/teams/vision")
            assert page.locator("section.grants tbody tr").count() == 2
            assert page.locator("section.queue tbody tr").count() == 3
            assert "needs" in page.locator("section.queue .why").first.inner_text()
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "gpupool-team.png"), full_page=True)

            page.locator('section.queue form:has(button[data-target="w3"]) input[name="priority"]').fill("5")
            page.locator('button[data-action="priority"][data-target="w3"]').click()
            assert page.locator("p.flash").inner_text() == "priority of w3 changed from 0 to 5"
            assert page.locator("section.queue tbody tr").first.locator("a.rid").inner_text() == "w3"

            page.locator('button[data-action="cancel"][data-target="w1"]').click()
            assert page.locator("p.flash").inner_text() == "cancelled waiting request w1"
            assert page.locator("section.queue tbody tr").count() == 2

            page.locator('section.grants tr:has(a.rid[title="g2"]) a.release').click()
            assert "Pod default/train-pod runs on this grant" in page.locator("p.fate").inner_text()
            page.locator('button[data-action="release"]').click()
            assert page.locator("p.flash").inner_text().startswith("revoked grant g2: revoked by ada")
            # Its pod gets its grace: the GPU passes on once its task has ended the pod.
            assert pool.get("w3").state is ReservationState.WAITING
            pool.release("g2")
            # The freed GPU went to w3, first since its new priority.
            assert pool.get("w3").state is ReservationState.GRANTED

            page.locator('button[data-action="cordon"][data-target="a1"]').click()
            assert "node a1 cordoned" in page.locator("p.flash").inner_text()
            assert page.locator("section.team-nodes .badge").inner_text() == "cordoned"
            page.locator('button[data-action="uncordon"][data-target="a1"]').click()
            page.locator('button[data-action="drain"][data-target="a1"]').click()
            assert page.locator("section.team-nodes .badge").inner_text() == "draining"

            # A refusal is shown plainly: w1 no longer waits.
            page.goto(url + "teams/vision", wait_until="load")
            whos = page.locator("section.actions tbody tr td:nth-child(2)").all_inner_texts()
            assert whos == ["ada"] * 6
            assert errors == []
        finally:
            browser.close()
    assert [a.action for a in LedgerActions(pool).entries("vision")] == [
        "drain",
        "uncordon",
        "cordon",
        "release",
        "cancel",
        "priority",
    ]


@pytest.mark.timeout(60)
def test_a_viewer_sees_no_actions_and_a_forged_form_is_refused(pool: Ledger) -> None:
    from playwright.sync_api import sync_playwright

    with serve_as(pool, SimpleAuthManagerUser(username="vic", role="viewer")) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            page.goto(url + "teams/vision", wait_until="load")
            assert page.locator("form.act").count() == 0
            assert "You may look but not act" in page.locator("p.readonly").inner_text()
            # The same post an admin's form makes, built by hand in the viewer's browser.
            page.evaluate(
                """() => { const f = document.createElement('form'); f.method = 'post';
                f.action = '../actions/cancel'; const i = document.createElement('input');
                i.name = 'target'; i.value = 'w1'; f.appendChild(i); document.body.appendChild(f); f.submit(); }"""
            )
            page.wait_for_selector("p.error")
            assert "vic may not act on the GPU pool" in page.locator("p.error").inner_text()
            page.goto(url + "reservations/g2/release", wait_until="load")
            assert "vic may not release grants" in page.locator("p.error").inner_text()
        finally:
            browser.close()
    assert pool.get("w1").state is ReservationState.WAITING
    assert LedgerActions(pool).entries() == []
