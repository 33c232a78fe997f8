"""No password is ever shown: every CLI command, error path, UI route and metrics path, with a sentinel.

The sentinel password holds ``#``, ``@`` and ``/`` (what breaks URLs built by concatenation). The
real PostgreSQL server (trust authentication: any password is accepted) answers the success
paths; a closed port, a bad port, an unsupported scheme and an unescaped password give the error
paths. Everything printed (stdout, stderr), logged (every logger, DEBUG), raised, returned by a UI
route or scraped from ``/metrics`` is searched for any piece of the sentinel.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from airflow_gpupool.cli import main
from airflow_gpupool.hooks.gpupool import GpuPoolHook
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.redact import redact_url, scrub

SENTINEL = "Sentinel#p@ss/w0rd"
#: Pieces of the sentinel that must not appear, raw or URL-escaped.
PIECES = ("Sentinel", "w0rd", quote(SENTINEL, safe=""), "p@ss", "p%40ss")
CLOSED = f"postgresql://postgres:{quote(SENTINEL, safe='')}@127.0.0.1:1/gpupool"

INVENTORY = """
nodes:
  - name: gpu-a
    cpu: 32
    memory: 128Gi
    gpus:
      - {model: A100, memory: 80Gi, count: 2}
"""


def assert_hidden(text: str, where: str) -> None:
    for piece in PIECES:
        assert piece not in text, f"{where} shows a piece of the password ({piece!r}):\n{text}"


@pytest.fixture
def sentinel_url(pg_schema_url: str) -> str:
    """The test's PostgreSQL schema, with the sentinel as its password (trust auth ignores it)."""
    return make_url(pg_schema_url).set(password=SENTINEL).render_as_string(hide_password=False)


@pytest.fixture(autouse=True)
def _short_retries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A closed port is retried for [gpupool] ledger_retry_seconds: keep the error paths quick.
    monkeypatch.setenv("AIRFLOW__GPUPOOL__LEDGER_RETRY_SECONDS", "0.2")
    monkeypatch.delenv("GPUPOOL_LEDGER_URL", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))


def run_cli(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, *argv: str) -> str:
    """Run a command in-process; return all it showed (output, logs, and any escaping error)."""
    caplog.clear()
    shown = []
    with caplog.at_level(logging.DEBUG):
        try:
            code = main(list(argv))
            shown.append(f"exit {code}")
        except SystemExit as e:  # argparse's usage errors
            shown.append(f"exit {e.code}")
        except Exception as e:  # a traceback is a bug too, but here only the secret is judged
            shown.append("".join(traceback.format_exception(e)))
    out, err = capsys.readouterr()
    shown += [out, err, caplog.text]
    return "\n".join(shown)


@pytest.fixture
def inventory_file(tmp_path: Path) -> str:
    path = tmp_path / "nodes.yaml"
    path.write_text(INVENTORY)
    return str(path)


@pytest.mark.postgres
def test_every_cli_command_hides_the_password(
    sentinel_url: str,
    inventory_file: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    missing_kubeconfig = str(tmp_path / "no-kubeconfig")
    commands = [
        ("ledger", "init"),
        ("inventory", "load", inventory_file),
        ("status",),
        ("status", "--json"),
        ("reserve", "--gpus", "1", "--id", "r-1", "--json"),
        ("reserve", "--gpus", "1", "--id", "r-1"),
        ("reserve", "--gpus", "8", "--id", "r-2", "--timeout", "60"),
        ("release", "r-1"),
        ("release", "r-2"),
        ("reap",),
        ("reconcile", "--kubeconfig", missing_kubeconfig),
        ("inventory", "sync", "--kubeconfig", missing_kubeconfig),
        ("controller", "run", "--once", "--kubeconfig", missing_kubeconfig),
        ("bench", "ledger", "--clients", "1", "--seconds", "0.3", "--nodes", "2", "--json"),
    ]
    outputs = {}
    for argv in commands:
        shown = run_cli(capsys, caplog, *argv, "--url", sentinel_url)
        assert_hidden(shown, f"gpupool {' '.join(argv)}")
        outputs[argv] = shown
    assert "postgres:***@127.0.0.1" in outputs[("ledger", "init")], "init names the ledger, redacted"
    assert "r-1 granted on gpu-a" in outputs[("reserve", "--gpus", "1", "--id", "r-1")]


@pytest.mark.parametrize(
    "url",
    [
        pytest.param(CLOSED, id="closed-port"),
        pytest.param(CLOSED.replace(":1/", ":99999/"), id="port-out-of-range"),
        pytest.param(CLOSED.replace(":1/", ":abc/"), id="port-not-a-number"),
        pytest.param(CLOSED.replace("postgresql://", "mysql://"), id="unsupported-scheme"),
        pytest.param(f"postgresql://postgres:{SENTINEL}@127.0.0.1:1/gpupool", id="unescaped-password"),
        pytest.param(f"postgres ql://postgres:{SENTINEL}@127.0.0.1", id="not-a-url"),
        pytest.param(f"{CLOSED}?password={quote(SENTINEL, safe='')}", id="password-in-query"),
    ],
)
@pytest.mark.parametrize(
    "argv",
    [("ledger", "init"), ("status",), ("status", "--json"), ("reserve", "--gpus", "1"), ("reap",)],
    ids=" ".join,
)
def test_error_paths_hide_the_password(
    url: str, argv: tuple[str, ...], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    shown = run_cli(capsys, caplog, *argv, "--url", url)
    assert_hidden(shown, f"gpupool {' '.join(argv)} --url <bad>")
    assert "exit 2" in shown, shown


def test_the_environment_and_the_connection_hide_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("GPUPOOL_LEDGER_URL", CLOSED)
    assert_hidden(run_cli(capsys, caplog, "status"), "status with GPUPOOL_LEDGER_URL")
    monkeypatch.delenv("GPUPOOL_LEDGER_URL")
    fields = {"conn_type": "gpupool", "host": "127.0.0.1", "port": 1, "login": "postgres"}
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", json.dumps({**fields, "password": SENTINEL}))
    shown = run_cli(capsys, caplog, "status")
    assert_hidden(shown, "status with the gpupool_default connection")
    # The URL came from the connection's fields: the closed port was reached, not a misread host.
    assert "127.0.0.1" in shown and "exit 2" in shown


def test_connection_fields_make_an_escaped_url(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = {"conn_type": "gpupool", "host": "db.internal", "port": 5433, "login": "gpupool"}
    monkeypatch.setenv("AIRFLOW_CONN_POOL_PG", json.dumps({**fields, "password": SENTINEL, "schema": "l"}))
    options = GpuPoolHook("pool_pg").options
    parsed = make_url(options.ledger_url)
    assert (parsed.password, parsed.host, parsed.port, parsed.database) == (
        SENTINEL,
        "db.internal",
        5433,
        "l",
    )
    assert_hidden(repr(options), "LedgerOptions' repr")
    assert_hidden(options.display_url, "LedgerOptions.display_url")
    assert options.display_url == "postgresql://gpupool:***@db.internal:5433/l"


@pytest.mark.parametrize(
    "url",
    [
        CLOSED,
        f"postgresql://u:{SENTINEL}@h/db",
        f"postgresql://u:{SENTINEL}@h:abc/db",
        f"postgresql://h/db?sslmode=require&password={SENTINEL}",
        f"u:{SENTINEL}@h",
    ],
)
def test_redact_url_and_scrub_hide_every_form(url: str) -> None:
    assert_hidden(redact_url(url), "redact_url")
    assert_hidden(scrub(f"could not open {url}: the driver quoted {SENTINEL}", url), "scrub")


def _routes(client: TestClient) -> Iterator[tuple[str, int, str]]:
    for path in ("/", "/?partial=true", "/api/v1/snapshot", "/api/v1/history", "/api/v1/series", "/metrics"):
        response = client.get(path)
        yield path, response.status_code, response.text


@pytest.mark.postgres
def test_ui_routes_and_metrics_hide_the_password(
    sentinel_url: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.api_fastapi.core_api.security import get_user
    from prometheus_client import generate_latest

    from airflow_gpupool.cli.metrics import make_registry
    from airflow_gpupool.plugins.app import create_app

    Ledger.create(sentinel_url).close()
    statuses = {}
    for name, url in (("up", sentinel_url), ("down", CLOSED)):
        app = create_app(lambda url=url: Ledger(url))  # type: ignore[misc]
        app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="v", role="viewer")
        with caplog.at_level(logging.DEBUG):
            for path, status, body in _routes(TestClient(app, raise_server_exceptions=False)):
                assert_hidden(body, f"UI route {path} ({name})")
                statuses[name, path] = status
            scraped = generate_latest(make_registry(url)).decode()
        assert_hidden(scraped, f"/metrics of gpupool metrics serve ({name})")
        assert_hidden(caplog.text + "".join(capsys.readouterr()), f"logs of the UI and metrics ({name})")
        caplog.clear()
    assert statuses["up", "/api/v1/snapshot"] == 200
    assert statuses["down", "/api/v1/snapshot"] == 503
