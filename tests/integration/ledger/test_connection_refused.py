"""A ledger URL the PostgreSQL server turns away (no such database or role) fails at once, typed.

Retrying cannot create a database: the ledger, the CLI and the benches say what the server
answered and how to fix it, without a driver's traceback or ``ledger_retry_seconds`` of retries.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy.engine import make_url

from airflow_gpupool.cli import main
from airflow_gpupool.exceptions import LedgerConnectionRefusedError
from airflow_gpupool.ledger import Ledger
from tests.ledger_fixtures import POSTGRES_URL, require_postgres

pytestmark = pytest.mark.postgres


@pytest.fixture
def missing_database_url() -> str:
    require_postgres()
    return (
        make_url(POSTGRES_URL).set(database="gpupool_no_such_database").render_as_string(hide_password=False)
    )


def test_a_database_that_does_not_exist_is_refused_at_once_not_retried(
    missing_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__LEDGER_RETRY_SECONDS", "30")
    started = time.monotonic()
    with pytest.raises(LedgerConnectionRefusedError) as caught:
        Ledger.create(missing_database_url)
    assert time.monotonic() - started < 10  # well inside the 30 s a retried outage would take
    assert caught.value.cause == 'database "gpupool_no_such_database" does not exist'
    assert "createdb" in str(caught.value)


def test_a_role_that_does_not_exist_is_refused_without_printing_its_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    require_postgres()
    url = make_url(POSTGRES_URL).set(username="gpupool_no_such_role", password="s3cret-pw")
    assert main(["status", "--url", url.render_as_string(hide_password=False)]) != 0
    err = capsys.readouterr().err
    assert 'refused the connection: role "gpupool_no_such_role" does not exist' in err
    assert "s3cret-pw" not in err and "Traceback" not in err


def test_the_queue_bench_says_so_too(missing_database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "queue", "--url", missing_database_url, "--waiters", "1", "--seconds", "1"]
    assert main(argv) != 0
    assert 'database "gpupool_no_such_database" does not exist' in capsys.readouterr().err
