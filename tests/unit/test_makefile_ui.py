"""``make ui`` is sized for a laptop and names its ports for what they serve (dry run: nothing starts)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.skips import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]


def dry_run(*variables: str) -> str:
    # --no-print-directory: under `make test` this make is nested (MAKELEVEL 1) and would print
    # "Entering/Leaving directory" lines around the commands.
    make = shutil.which("make")
    if make is None:
        skip_or_fail("make is not installed", what="the Makefile check")
    done = subprocess.run(
        [make, "--no-print-directory", "-n", "ui", *variables],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_make_ui_runs_few_workers_on_the_chosen_ports() -> None:
    commands = dry_run()
    assert "AIRFLOW__CORE__PARALLELISM=4 " in commands  # not the 32 LocalExecutor workers of the default
    assert "AIRFLOW__API__WORKERS=1 " in commands
    assert "AIRFLOW__API__PORT=8080 " in commands
    assert commands.rstrip().endswith("--emulator-port 8001")


def test_make_ui_ports_and_workers_can_be_chosen() -> None:
    commands = dry_run("EMULATOR_PORT=9001", "AIRFLOW_UI_PORT=9080", "UI_WORKERS=2")
    assert "AIRFLOW__CORE__PARALLELISM=2 " in commands and "AIRFLOW__API__PORT=9080 " in commands
    assert "--emulator-port 9001\n" in commands and "UI_PORT" not in (ROOT / "Makefile").read_text().replace(
        "AIRFLOW_UI_PORT", ""
    )
