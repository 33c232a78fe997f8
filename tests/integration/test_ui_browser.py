"""The GPU pool page in a real headless Chromium: it renders the GPU map a person would see.

Needs Debian's ``chromium`` (``/usr/bin/chromium``, or ``GPUPOOL_TEST_CHROMIUM``) and the
``playwright`` package (the test extra; its own browser downloads are not used). Without
them the test skips with the reason, except under ``CI=true``, where it fails: CI must run
it (``.ci/run`` installs Chromium). The screenshot lands in ``test-artifacts/``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from fastapi import FastAPI

from airflow_gpupool.ledger import Ledger
from airflow_gpupool.plugins.app import create_app
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import FakeClock, node
from tests.skips import skip_or_fail
from tests.unit.metrics.scenario import Pool, build_pool

CHROMIUM = os.environ.get("GPUPOOL_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def browser_ready() -> None:
    """Skip (or, under CI=true, fail) before anything starts when there is no browser to drive."""
    require_browser()


def require_browser() -> None:
    """Skip (or, under CI=true, fail) the test when there is no browser to drive."""
    reason = None
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) and not shutil.which(CHROMIUM):
        reason = f"no Chromium at {CHROMIUM} (apt-get install -y chromium, or set GPUPOOL_TEST_CHROMIUM)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "the playwright package is not installed (pip install -e '.[test]')"
    if reason is not None:
        skip_or_fail(reason, what="the browser test")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def pool(browser_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    built = build_pool(f"sqlite:///{tmp_path_factory.mktemp('browser')}/ledger.db")
    yield built
    built.ledger.close()


@pytest.fixture
def server(browser_ready: None, pool: Pool) -> Iterator[str]:
    """Serve the scenario's ledger as the Airflow API server mounts the plugin app."""
    with serve(pool.ledger) as url:
        yield url


@contextlib.contextmanager
def serve(ledger: Ledger) -> Iterator[str]:
    """Serve the plugin app of ``ledger`` under ``/gpupool`` on 127.0.0.1, as the Airflow API server mounts it."""
    root = FastAPI()
    app = create_app(lambda: ledger)
    # Login is Airflow's job; here the user is given (the anonymous case is in test_ui_plugin).
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer", role="viewer")
    root.mount("/gpupool", app)
    port = _free_port()
    config = uvicorn.Config(root, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    uv = uvicorn.Server(config)
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


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("viewport", "name"), [((1366, 900), "laptop"), ((2560, 1300), "wide")])
def test_page_renders_the_gpu_map(server: str, viewport: tuple[int, int], name: str) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
    ]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server, wait_until="load")
            nodes = page.locator("article.node")
            # Grouped by node pool (a small cluster opens every pool), each pool's nodes by name.
            pools = page.locator("div.pool").evaluate_all("els => els.map(e => e.dataset.pool)")
            assert pools == ["infer", "mig", "train"]
            assert nodes.evaluate_all("els => els.map(e => e.dataset.node)") == ["t4-1", "a100-mig", "a100-1"]
            assert (
                "1 node · 2 GPUs · 1.25 held (62%) · 2 grants"
                in page.locator('div.pool[data-pool="train"]').inner_text()
            )
            assert page.locator("article.node.health-quarantined").get_attribute("data-node") == "t4-1"
            books = page.locator('article.node[data-node="a100-1"] .books')
            assert books.inner_text() == "ledger: 1.25 granted · 0 external · 0.75 free GPUs"
            assert page.locator(".gpu").count() == 4
            held = page.locator(".seg.held").evaluate_all("els => els.map(e => e.dataset.reservation)")
            assert sorted(held) == ["r-embed", "r-mig", "r-train"]
            # Slices are drawn to scale: the whole GPU fills its bar, the quarter about a quarter.
            bar = page.locator('.gpu[data-node="a100-1"][data-gpu="1"] .bar').bounding_box()
            quarter = page.locator('.seg[data-reservation="r-embed"]').bounding_box()
            assert bar is not None and quarter is not None
            assert 0.2 < quarter["width"] / bar["width"] < 0.3
            link = page.locator('.seg[data-reservation="r-train"] a')
            assert (
                link.get_attribute("href")
                == "/dags/train_dag/runs/manual__2027-01-15T10%3A00%3A00%2B00%3A00/tasks/fit"
            )
            assert page.locator("section.queue tbody tr").count() == 2
            assert "needs 2 free GPUs" in page.locator("section.queue").inner_text()
            # The whole page fits the width: nothing scrolls sideways.
            assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
            page.screenshot(path=str(ARTIFACTS / f"gpupool-{name}.png"), full_page=True)
            assert errors == []
        finally:
            browser.close()


@pytest.mark.timeout(60)
def test_a_preempting_grants_grace_counts_down_in_the_browser(browser_ready: None, tmp_path: Path) -> None:
    """The server renders the grace left (90 s); the page's script ticks it down without a refresh."""
    from playwright.sync_api import sync_playwright

    clock = FakeClock()
    with Ledger.create(
        f"sqlite:///{tmp_path}/ledger.db", clock=clock, min_runtime_seconds=60, preemption_grace_seconds=120
    ) as ledger:
        ledger.upsert_nodes([node("a1", gpus=2, pool="a100")])
        ledger.reserve(
            GpuRequest(gpus=2, team="vision", preemptible=True), "v@w", reservation_id="r-v", ttl=3600
        )
        clock.advance(300)
        ledger.reserve(GpuRequest(gpus=1, team="ops", priority=100), "o@w", reservation_id="r-o", timeout=600)
        clock.advance(30)
        with serve(ledger) as url, sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"], headless=True
            )
            try:
                page = browser.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(url, wait_until="load")
                countdown = page.locator("section.grants .countdown")
                assert countdown.get_attribute("data-left") == "90.000"
                segments = page.locator(".seg.held.preempting")  # one per GPU it holds
                assert segments.count() == 2
                assert "preempting for r-o" in (segments.first.get_attribute("title") or "")
                # The ledger's clock stands still: only the script can make it tick.
                page.wait_for_function(
                    "() => document.querySelector('section.grants .countdown').textContent === '1m 28s'",
                    timeout=10_000,
                )
                page.goto(url + "reservations/r-v", wait_until="load")
                page.wait_for_function(
                    "() => document.querySelector('.countdown').textContent === '1m 29s'", timeout=10_000
                )
                assert errors == []
            finally:
                browser.close()
