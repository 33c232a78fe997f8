"""The quota state machine fails when a rule it guards is broken: each break planted in a copy of the package.

As ``tests/unit/test_layers.py`` plants an upward import, each case here copies the package, replaces
one line of a rule with its broken form and runs :class:`QuotaMachine` on the copy in a fresh
interpreter, on the same sequences every run (``fixed``): the run must fail, naming the broken
invariant. SQLite in every run; PostgreSQL under ``CI=true``. The runs start together (see
:func:`planted_runs`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.skips import under_ci

ROOT = Path(__file__).resolve().parents[3]

#: Each case: the file changed, the text replaced in it (exactly once), its broken form, and what
#: the failing invariant says.
PLANTED = {
    "borrowing limit unchecked": (
        "airflow_gpupool/governance/admission.py",
        "if limit is not None and borrow > limit:",
        "if False:",
        "holds",
    ),
    "lending limit's min removed": (
        "airflow_gpupool/governance/admission.py",
        "return unused if quota.lending_limit_milli is None else min(unused, quota.lending_limit_milli)",
        "return unused",
        "its lenders lend",
    ),
    "headroom given to non-urgent work that is not on loan": (
        "airflow_gpupool/governance/queue_pass.py",
        "if not headroom.active or not milli or lent or self.urgent(request):",
        "if not headroom.active or not milli or lent or self.urgent(request) or not request.preemptible:",
        "held by work that is neither urgent nor on loan",
    ),
    "a preempting grant offered to a second preemptor": (
        "airflow_gpupool/ledger/teams/preempting.py",
        "    _r.preempt_deadline.is_(None),\n",
        "",
        "preempted for",
    ),
}

RUN = """
import sys
from pathlib import Path
from tests.integration.ledger.test_ledger_properties import run_ledger_machine
from tests.integration.ledger.test_quota_state_machine import QuotaMachine
run_ledger_machine(QuotaMachine, sys.argv[1], Path(sys.argv[2]), examples=30, steps=30, fixed=True)
"""


def _copy_with(tmp_path: Path, path: str, text: str, broken: str) -> Path:
    """Copy the package, the tests and pyproject.toml into ``tmp_path``, ``text`` in ``path`` made ``broken``."""
    root = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "airflow_gpupool", root / "airflow_gpupool", ignore=ignore)
    shutil.copytree(ROOT / "tests", root / "tests", ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", root)
    planted = root / path
    source = planted.read_text()
    assert source.count(text) == 1, f"{path} no longer says {text!r}: plant the break anew"
    planted.write_text(source.replace(text, broken))
    return root


BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param(
        "postgresql",
        id="postgresql",
        marks=[
            pytest.mark.postgres,
            pytest.mark.skipif(not under_ci(), reason="PostgreSQL's planted runs are CI's (CI=true)"),
        ],
    ),
]


@pytest.fixture(scope="module")
def planted_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[tuple[str, str], subprocess.Popen[str]]]:
    """Start every planted run of the module at once, each in its own interpreter and copy.

    The runs are independent and mostly CPU-bound: side by side they take about half the time
    they take one after another on two cores, and each test then waits only for its own.
    """
    backends = ["sqlite", "postgresql"] if under_ci() else ["sqlite"]
    runs: dict[tuple[str, str], subprocess.Popen[str]] = {}
    for case, (path, text, broken, _shown) in sorted(PLANTED.items()):
        for backend in backends:
            tmp_path = tmp_path_factory.mktemp(f"planted-{backend}")
            root = _copy_with(tmp_path, path, text, broken)
            databases = tmp_path / "db"
            databases.mkdir()
            runs[case, backend] = subprocess.Popen(
                [sys.executable, "-c", RUN, backend, str(databases)],
                cwd=root,
                env={**os.environ, "PYTHONPATH": str(root)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
    yield runs
    for run in runs.values():
        if run.poll() is None:
            run.kill()
            run.communicate()


# The first test waits while all the runs share the two cores.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_planted_break_fails_the_quota_state_machine(
    planted_runs: dict[tuple[str, str], subprocess.Popen[str]], case: str, backend: str
) -> None:
    shown = PLANTED[case][3]
    run = planted_runs[case, backend]
    report, _ = run.communicate(timeout=900)
    assert run.returncode == 1, report[-3000:]
    assert "AssertionError" in report and shown in report, report[-3000:]
