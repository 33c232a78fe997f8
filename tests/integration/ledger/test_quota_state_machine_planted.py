"""The quota state machine fails when a rule it guards is broken: each break planted in a copy of the package.

As ``tests/unit/test_layers.py`` plants an upward import, each case here copies the package, replaces
one line of a rule with its broken form and runs :class:`QuotaMachine` on the copy in a fresh
interpreter, on the same sequences every run (``fixed``): the run must fail, naming the broken
invariant. SQLite in every run; PostgreSQL under ``CI=true`` (a few minutes more).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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
        "airflow_gpupool/ledger/teams/admission.py",
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


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("sqlite", id="sqlite"),
        pytest.param(
            "postgresql",
            id="postgresql",
            marks=[
                pytest.mark.postgres,
                pytest.mark.skipif(not under_ci(), reason="PostgreSQL's planted runs are CI's (CI=true)"),
            ],
        ),
    ],
)
@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_planted_break_fails_the_quota_state_machine(tmp_path: Path, case: str, backend: str) -> None:
    path, text, broken, shown = PLANTED[case]
    root = _copy_with(tmp_path, path, text, broken)
    databases = tmp_path / "db"
    databases.mkdir()
    env = {**os.environ, "PYTHONPATH": str(root)}
    result = subprocess.run(
        [sys.executable, "-c", RUN, backend, str(databases)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = result.stdout + result.stderr
    assert result.returncode == 1, report[-3000:]
    assert "AssertionError" in report and shown in report, report[-3000:]
