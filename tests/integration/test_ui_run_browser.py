"""A run's GPU steps as one chain in a real headless Chromium: from the history to the run's page.

Needs Debian's Chromium and the playwright package, as test_ui_browser (skips without them,
fails under CI=true). The screenshot lands in ``test-artifacts/``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_gpupool.ledger import Ledger
from tests.integration.test_run_chain import RUN, tell_story
from tests.integration.test_ui_browser import ARTIFACTS, CHROMIUM, browser_ready, serve  # noqa: F401
from tests.ledger_fixtures import FakeClock

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]


@pytest.mark.timeout(90)
def test_a_person_opens_a_runs_chain_from_the_history(browser_ready: None, tmp_path: Path) -> None:  # noqa: F811
    from playwright.sync_api import sync_playwright

    clock = FakeClock()
    with Ledger.create(f"sqlite:///{tmp_path}/ledger.db", clock=clock) as ledger:
        tell_story(ledger, clock)
        with serve(ledger) as url, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1366, "height": 900})
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(url + "?dag_id=pipe", wait_until="load")
                page.locator("section.history").screenshot(path=str(ARTIFACTS / "gpupool-run-history.png"))
                row = page.locator("section.history tbody tr", has_text="pipe / evaluate")
                row.locator("a.run-link").click()
                page.wait_for_url("**/gpupool/run?**")
                run = page.locator("section.run")
                assert run.get_attribute("data-run") == RUN
                steps = page.locator("ol.chain li.step")
                assert steps.evaluate_all("els => els.map(e => e.querySelector('b').textContent)") == [
                    "preprocess",
                    "train",
                    "evaluate",
                    "export",
                ]
                joints = page.locator("ol.chain li.joint").all_inner_texts()
                assert joints == ["gap 0s →", "handed on →", "→"]
                assert "queued ahead" in steps.nth(3).inner_text()
                ahead = steps.nth(3).locator(".mark.queued-ahead").get_attribute("title")
                assert ahead == "not granted before 2027-01-15 08:33:20 UTC"
                assert "handed on from train" in steps.nth(2).inner_text()
                # The steps sit in one row at a laptop's width, and nothing scrolls sideways.
                tops = steps.evaluate_all("els => els.map(e => Math.round(e.getBoundingClientRect().top))")
                assert len(set(tops)) == 1, tops
                assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
                assert page.locator("table.run-steps tbody tr").count() == 4
                page.screenshot(path=str(ARTIFACTS / "gpupool-run-chain.png"), full_page=True)
                # On a wide screen (where the overview has two columns) the run takes the whole width.
                page.set_viewport_size({"width": 2560, "height": 1300})
                widths = page.evaluate(
                    "[document.querySelector('section.run').getBoundingClientRect().width,"
                    " document.querySelector('main').clientWidth]"
                )
                assert widths[0] > widths[1] - 60, widths
                # Its steps' ids open their reservations; back goes to the pool.
                page.locator("table.run-steps a.rid").nth(1).click()
                page.wait_for_url("**/gpupool/reservations/gp-*")
                assert "pipe / train" in page.locator("section.reservation").inner_text()
                page.locator("section.reservation a.run-link").click()
                page.wait_for_url("**/gpupool/run?**")
                page.locator("section.run a", has_text="back to the GPU pool").click()
                page.wait_for_url(url)
                assert errors == []
            finally:
                browser.close()
