"""The GPU pool page embedded in the real Airflow UI, driven by a headless Chromium.

Airflow 3 shows an external view in an iframe sandboxed without top navigation
(``allow-scripts allow-same-origin allow-forms allow-downloads``), so a ``target="_top"`` link
does nothing there. The ledger is populated for real: a ``GpuPodOperator`` DAG runs with
``dag.test()`` against the Kubernetes emulator (its try pushes the "GPU reservation" extra
link), then teams hold and release slices. This test starts ``airflow api-server`` with the
plugin, opens the page from Airflow's navigation (``/plugin/gpupool``), chooses a range and
filters the history inside the iframe, clicks a task link there, checks that the Airflow UI
itself went to that task instance's page, and clicks its "GPU reservation" extra link, which
opens that try's reservation page. Screenshots go to ``test-artifacts/``. Needs Chromium and
playwright as ``test_ui_browser.py`` does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_gpupool.ledger import Ledger
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.task_try import TaskTry
from tests.integration.conftest import ledger_inventory
from tests.integration.test_ui_browser import ARTIFACTS, CHROMIUM, require_browser
from tests.unit.metrics.scenario import TRAIN_HOLDER

DAG_ID = "gpu_bind_whole"  # tests/integration/dags: one GpuPodOperator task, "train"
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _populate(url: str, dagbag: Any) -> str:
    """Run the DAG's GpuPodOperator for real, then let teams hold and release slices; return its run id."""
    ledger = Ledger.create(url)
    ledger.upsert_nodes(ledger_inventory())
    extra = {
        "ledger_url": url,
        "poll_interval_seconds": 0.2,
        "node_pool_bindings": "a100-mig=mig,t4-shared=hami",
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", json.dumps({"conn_type": "gpupool", "extra": extra}))
        dag_run = dagbag.get_dag(DAG_ID).test()
    assert str(dag_run.get_task_instances()[0].state) == "success"
    for n, team in enumerate(["vision", "nlp", "nlp", "speech"]):
        holder = TaskTry(f"{team}_dag", "step", f"manual__{n}", -1, 1, "w").holder
        done = ledger.reserve(GpuRequest(gpu_milli=500, team=team), holder, reservation_id=f"r-{team}-{n}")
        ledger.release(done.id)
    ledger.reserve(GpuRequest(gpus=1, team="vision"), TRAIN_HOLDER, reservation_id="r-train", ttl=3600)
    ledger.close()
    return str(dag_run.run_id)


@pytest.fixture(scope="module")
def airflow_ui(dagbag: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Serve the Airflow UI with the GPU pool plugin over a populated ledger; return its base URL and run id."""
    require_browser()
    ledger_url = f"sqlite:///{tmp_path_factory.mktemp('embedded')}/ledger.db"
    run_id = _populate(ledger_url, dagbag)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_GPUPOOL")}
    root = str(Path(__file__).resolve().parents[2])
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p),
        GPUPOOL_LEDGER_URL=ledger_url,
        AIRFLOW__CORE__AUTH_MANAGER="airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
    )
    ARTIFACTS.mkdir(exist_ok=True)
    log = open(ARTIFACTS / "embedded-api-server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "airflow", "api-server", "--port", str(port)], env=env, stdout=log, stderr=log
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/v2/version", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail(
                        f"airflow api-server did not start (see {ARTIFACTS / 'embedded-api-server.log'})"
                    )
                time.sleep(0.5)
        yield base, run_id
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.mark.timeout(300)
def test_the_embedded_page_filters_and_its_links_open_airflow_pages(airflow_ui: tuple[str, str]) -> None:
    from playwright.sync_api import expect, sync_playwright

    base, run_id = airflow_ui
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 900})
            blocked: list[str] = []
            page.on("console", lambda m: blocked.append(m.text) if "Unsafe attempt" in m.text else None)
            page.goto(f"{base}/plugin/gpupool", wait_until="networkidle")
            iframe = page.locator("iframe")
            # The sandbox this page must work in: no top navigation, no pop-ups.
            assert (
                iframe.get_attribute("sandbox")
                == "allow-scripts allow-same-origin allow-forms allow-downloads"
            )
            frame = page.frame_locator("iframe")
            frame.locator("article.node").first.wait_for(timeout=30000)
            page.screenshot(path=str(ARTIFACTS / "gpupool-embedded.png"))

            # The per-team view over a chosen range: every team that held a slice, with its GPU-hours.
            frame.locator("nav.ranges a", has_text="7d").click()
            frame.locator("nav.ranges a.on", has_text="7d").wait_for(timeout=15000)
            teams = frame.locator("table.by-team tbody tr").all_inner_texts()
            assert [t.split()[0] for t in teams] == ["nlp", "speech", "vision"]
            # The history, filtered by team through the page's own form.
            frame.locator('form.filters select[name="team"]').select_option("nlp")
            frame.locator("form.filters button").click()
            rids = frame.locator("table.history a.rid")
            expect(rids).to_have_count(2, timeout=15000)  # the filtered page has loaded
            assert rids.evaluate_all("els => els.map(e => e.title)") == ["r-nlp-2", "r-nlp-1"]
            assert frame.locator('select[name="team"] option[value="nlp"]').get_attribute("selected") == ""
            frame.locator('form.filters select[name="team"]').select_option("")
            frame.locator('form.filters select[name="dag_id"]').select_option(DAG_ID)
            frame.locator("form.filters button").click()
            row = frame.locator("table.history tbody tr")
            expect(row).to_have_count(1, timeout=15000)
            expect(row).to_contain_text("released")
            page.screenshot(path=str(ARTIFACTS / "gpupool-embedded-filtered.png"), full_page=True)

            # A task link inside the sandboxed iframe: the Airflow UI itself goes to the task instance.
            link = row.locator("a.ti")
            task_url = f"/dags/{DAG_ID}/runs/{quote(run_id, safe='')}/tasks/train"
            assert link.get_attribute("href") == task_url and link.get_attribute("target") is None
            link.click()
            page.wait_for_url(f"**{task_url}", timeout=15000)
            # The Airflow UI routed there itself: its task-instance page, not our iframe.
            expect(page.locator("iframe")).to_have_count(0, timeout=15000)
            # Its "GPU reservation" extra link (Airflow lists a task's extra links under Details)
            # opens this try's reservation page.
            page.get_by_text("Details", exact=True).last.click()
            extra = page.get_by_role("link", name="GPU reservation")
            extra.wait_for(timeout=30000)
            page.screenshot(path=str(ARTIFACTS / "gpupool-embedded-task.png"))
            reservation_id = TaskTry(DAG_ID, "train", run_id, -1, 1).reservation_id
            assert extra.get_attribute("target") == "_self"  # same origin: Airflow opens it in place
            extra.click()
            page.wait_for_url(f"**/gpupool/reservations/{reservation_id}?try=*", timeout=15000)
            page.get_by_text(f"Reservation {reservation_id}").wait_for(timeout=15000)
            assert "<dt>State</dt><dd>released</dd>" in page.content()
            assert "<dt>Ran on</dt><dd>gpu-a100 (node pool a100), GPU 0,1" in page.content()
            page.screenshot(path=str(ARTIFACTS / "gpupool-embedded-reservation.png"))
            assert blocked == []
        finally:
            browser.close()


@pytest.mark.timeout(300)
def test_the_menu_entry_opens_the_overview_from_a_reservation_or_a_team_page(
    airflow_ui: tuple[str, str],
) -> None:
    """Airflow keeps the frame when its own route's menu entry is clicked; the page goes back to the overview."""
    from playwright.sync_api import sync_playwright

    base, _run_id = airflow_ui
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 900})
            page.goto(f"{base}/plugin/gpupool", wait_until="networkidle")
            frame = page.frame_locator("iframe")
            frame.locator("article.node").first.wait_for(timeout=30000)

            def open_from_menu() -> None:
                page.get_by_role("button", name="Browse").click()
                page.get_by_role("menuitem", name="GPU pool").click()
                frame.locator("article.node").first.wait_for(timeout=15000)

            frame.locator("table.history a.rid").first.click()
            frame.locator("section.reservation").wait_for(timeout=15000)
            open_from_menu()
            frame.locator("section.grants a.team-link", has_text="vision").click()
            frame.locator('section.team[data-team="vision"]').wait_for(timeout=15000)
            open_from_menu()
            assert page.locator("iframe").count() == 1
        finally:
            browser.close()
