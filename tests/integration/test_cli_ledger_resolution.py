"""The CLI finds the ledger as the operator does, and no read command creates one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_gpupool.cli import main


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("GPUPOOL_LEDGER_URL", "AIRFLOW_CONN_GPUPOOL_DEFAULT", "AIRFLOW__GPUPOOL__LEDGER_URL"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "argv", [("status",), ("status", "--json"), ("reap",), ("release", "x")], ids=" ".join
)
@pytest.mark.parametrize("where", ["missing-file", "missing-directory"])
def test_reads_never_create_a_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], where: str
) -> None:
    path = tmp_path / ("absent.db" if where == "missing-file" else "no/such/dir/ledger.db")
    url = f"sqlite:///{path}"
    code, out, err = run(capsys, *argv, "--url", url)
    assert (code, out) == (2, "")
    assert (
        err == f"gpupool: error: no GPU ledger at {url}: create it with `gpupool ledger init --url {url}`\n"
    )
    assert not path.exists() and path.parent.exists() == (where == "missing-file")


def test_the_cli_uses_the_gpupool_default_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    conn_url = f"sqlite:///{tmp_path}/from-connection.db"
    env_url = f"sqlite:///{tmp_path}/from-env.db"
    extra = {"ledger_url": conn_url}
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", json.dumps({"conn_type": "gpupool", "extra": extra}))
    monkeypatch.setenv("AIRFLOW__GPUPOOL__LEDGER_URL", f"sqlite:///{tmp_path}/from-config.db")

    assert run(capsys, "ledger", "init")[1].startswith(f"ledger at {conn_url}: ")
    monkeypatch.setenv("GPUPOOL_LEDGER_URL", env_url)
    assert run(capsys, "ledger", "init")[1].startswith(f"ledger at {env_url}: ")
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["from-connection.db", "from-env.db"]


def test_a_malformed_connection_is_an_error_not_a_fallback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    extra = {"ledger_uri": "sqlite:////tmp/typo.db"}
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", json.dumps({"conn_type": "gpupool", "extra": extra}))
    code, _, err = run(capsys, "ledger", "init")
    assert code == 2 and "unknown extras ['ledger_uri']" in err
    assert not (tmp_path / "home" / "gpupool-ledger.db").exists()
