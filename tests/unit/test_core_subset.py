"""The core subset that ``make test-oldest`` runs on the oldest supported Airflow names real files."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import CORE_FILES

ROOT = Path(__file__).resolve().parents[2]


def test_every_core_file_exists() -> None:
    # A renamed or moved file would silently drop out of the oldest Airflow's run.
    assert sorted(f for f in CORE_FILES if not (ROOT / f).is_file()) == []
