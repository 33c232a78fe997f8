"""The GPU pool page embedded in the real Airflow UI, driven by a headless Chromium.

Airflow 3 shows an external view in an iframe sandboxed without top navigation
(``allow-scripts allow-same-origin allow-forms allow-downloads``), so a ``target="_top"`` link
does nothing there. This test starts ``airflow api-server`` with the plugin, opens the page from
Airflow's navigation (``/plugin/gpupool``), clicks a task link inside the iframe, and checks
that the Airflow UI itself went to that task instance's page. Screenshots go to
``test-artifacts/``. Needs Chromium and playwright as ``test_ui_browser.py`` does.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_ui_browser import ARTIFACTS, CHROMIUM, require_browser
from tests.unit.metrics.scenario import build_pool

TASK_URL = "/dags/train_dag/runs/manual__2027-01-15T10%3A00%3A00%2B00%3A00/tasks/fit"
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def airflow_ui(airflow_db: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Serve the Airflow UI with the GPU pool plugin over the scenario ledger; return its base URL."""
    require_browser()
    ledger_url = f"sqlite:///{tmp_path_factory.mktemp('embedded')}/ledger.db"
    build_pool(ledger_url).ledger.close()
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
        yield base
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.mark.timeout(240)
def test_a_task_link_in_the_embedded_page_opens_the_task_in_airflow(airflow_ui: str) -> None:
    from playwright.sync_api import sync_playwright

    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 900})
            blocked: list[str] = []
            page.on("console", lambda m: blocked.append(m.text) if "Unsafe attempt" in m.text else None)
            page.goto(f"{airflow_ui}/plugin/gpupool", wait_until="networkidle")
            iframe = page.locator("iframe")
            # The sandbox this page must work in: no top navigation, no pop-ups.
            assert (
                iframe.get_attribute("sandbox")
                == "allow-scripts allow-same-origin allow-forms allow-downloads"
            )
            frame = page.frame_locator("iframe")
            frame.locator("article.node").first.wait_for(timeout=30000)
            page.screenshot(path=str(ARTIFACTS / "gpupool-embedded.png"))
            link = frame.locator('.seg[data-reservation="r-train"] a')
            assert link.get_attribute("href") == TASK_URL
            assert link.get_attribute("target") is None

            link.click()
            page.wait_for_url(f"**{TASK_URL}", timeout=15000)
            # The Airflow UI routed there itself: its task-instance page, not our iframe.
            page.get_by_text("Task", exact=True).first.wait_for(timeout=15000)
            assert page.locator("iframe").count() == 0
            page.screenshot(path=str(ARTIFACTS / "gpupool-embedded-after-click.png"))
            assert blocked == []
        finally:
            browser.close()
