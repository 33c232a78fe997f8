"""The kit's AIRFLOW_HOME: a temporary directory unless the user set one, removed at the end."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

from airflow_gpupool.testkit.home import KIT_HOME_VARIABLE, PREFIX, AirflowHomeWarning, isolate_airflow_home


@pytest.fixture
def unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No AIRFLOW_HOME and Airflow not yet imported; temporary directories made under ``tmp_path``."""
    monkeypatch.delenv("AIRFLOW_HOME", raising=False)
    monkeypatch.delenv(KIT_HOME_VARIABLE, raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delitem(sys.modules, "airflow.configuration", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    return tmp_path


def test_without_airflow_home_a_temporary_one_is_set_and_removed(unset: Path) -> None:
    with isolate_airflow_home() as home:
        assert home.temporary
        assert home.path.parent == unset and home.path.name.startswith(PREFIX)
        assert os.environ["AIRFLOW_HOME"] == str(home.path)
        (home.path / "airflow.cfg").write_text("[core]\n")
    assert not home.path.exists()
    assert "AIRFLOW_HOME" not in os.environ


def test_an_airflow_home_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    with isolate_airflow_home() as home:
        assert (home.path, home.temporary) == (tmp_path, False)
    assert tmp_path.is_dir()
    assert os.environ["AIRFLOW_HOME"] == str(tmp_path)


def test_airflow_imported_first_is_reported_not_split(unset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    configuration = types.ModuleType("airflow.configuration")
    configuration.AIRFLOW_HOME = "/root/airflow"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "airflow.configuration", configuration)
    with pytest.warns(AirflowHomeWarning, match="/root/airflow"):
        home = isolate_airflow_home()
    assert (home.path, home.temporary) == (Path("/root/airflow"), False)
    assert "AIRFLOW_HOME" not in os.environ  # subprocesses must use the home Airflow already chose


def test_a_pytest_xdist_worker_gets_its_own_home_not_the_controllers(
    unset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with isolate_airflow_home() as controller:
        # What a worker process inherits from the controller, and what xdist sets in it.
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
        with isolate_airflow_home() as worker:
            assert worker.temporary and worker.path != controller.path
            assert os.environ["AIRFLOW_HOME"] == str(worker.path)
        assert controller.path.is_dir()  # the worker removes only its own


def test_a_pytest_xdist_worker_shares_a_home_the_user_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.delenv(KIT_HOME_VARIABLE, raising=False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    with isolate_airflow_home() as home:
        assert (home.path, home.temporary) == (tmp_path, False)
