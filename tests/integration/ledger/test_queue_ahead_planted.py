"""The ledger's state machine fails when queue ahead is broken: planted breaks, each run in a fresh interpreter.

With no withdraw (an upstream that ends any way but success leaves what queued ahead of it), the
machine's check that nothing queued ahead outlives a failed upstream must fail; with a stepped-back
request due again at once, its check that a stepped-back request holds no GPUs unclaimed must fail.

Each search runs on the same sequences every run (``fixed``), in an interpreter of its own started
from the same script, as the quota machine's planted runs do: in the suite's own process the
sequences a fixed search draws depend on what ran before it (seen: a search that finds its break
at example 85 alone found none in 159 after ``test_connection_refused.py``), so an in-process
search cannot show reliably that a check works.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

RUN = """
import sys
from pathlib import Path
from airflow_gpupool.ledger.queue import ahead
from tests.integration.ledger.test_ledger_properties import LedgerMachine, run_ledger_machine
if sys.argv[1] == "no withdraw":
    ahead.withdraw = lambda tx, ends, upstream, how: []
else:  # due again at once: the next pass grants a stepped-back request
    ahead.STEPPED_BACK_FOR = -1.0
run_ledger_machine(LedgerMachine, "sqlite", Path(sys.argv[2]), examples=400, fixed=True)
"""


def _planted_run(tmp_path: Path, case: str) -> str:
    """Run the machine with ``case`` planted; return what it printed (it must fail)."""
    run = subprocess.run(
        [sys.executable, "-c", RUN, case, str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 1 and "AssertionError" in report, report[-3000:]
    return report


@pytest.mark.timeout(600)
def test_the_state_machine_finds_a_request_that_outlived_its_failed_upstream(tmp_path: Path) -> None:
    # Caught as "outlived its upstream", or first by the queue's positions check, which the
    # orphaned request also breaks: any failing invariant counts (the unbroken ledger passes them all).
    _planted_run(tmp_path, "no withdraw")


@pytest.mark.timeout(600)
def test_the_state_machine_finds_a_stepped_back_request_granted_again(tmp_path: Path) -> None:
    # Caught by the step-back check, or first by the queue's own view of a request due too early.
    _planted_run(tmp_path, "stepped back due at once")
