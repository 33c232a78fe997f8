"""The multi-worker harness itself: readiness waits, failure reports with log tails, and teardown."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.multiworker.harness import HarnessError, ProcessGroup, airflow_env

# A parent that starts a child in a process group of its own (as Airflow's task runner does),
# says so, and sleeps.
TREE = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], process_group=0)
print("child", child.pid, flush=True)
time.sleep(600)
"""


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_dead_process_fails_the_wait_with_its_log_tail(tmp_path: Path) -> None:
    with ProcessGroup(tmp_path, dict(os.environ)) as procs:
        procs.start("doomed", python("print('about to fail', flush=True); raise SystemExit(3)"))
        with pytest.raises(HarnessError, match=r"(?s)died: doomed.*doomed \(exited 3\).*about to fail"):
            procs.wait_for("something", lambda: None, timeout=30, interval=0.05)


def test_a_timeout_names_what_it_waited_for(tmp_path: Path) -> None:
    with ProcessGroup(tmp_path, dict(os.environ)) as procs:
        procs.start("quiet", python("print('hello', flush=True); import time; time.sleep(60)"))
        assert procs.wait_for_line("quiet", r"hel+o", timeout=30) == "hello"
        with pytest.raises(
            HarnessError, match=r"(?s)timed out after 0.3s waiting for quiet to log /never/.*hello"
        ):
            procs.wait_for_line("quiet", r"never", timeout=0.3)


def test_kill_all_reaches_a_child_in_its_own_process_group(tmp_path: Path) -> None:
    with ProcessGroup(tmp_path, dict(os.environ)) as procs:
        parent = procs.start("tree", python(TREE))
        line = procs.wait_for_line("tree", r"child \d+", timeout=30)
        child = int(line.split()[1])
        assert os.getpgid(child) != os.getpgid(parent.pid)
        parent.killed = True
        assert child in parent.kill_all()
        assert parent.popen.wait(10) < 0
        assert _gone(child)


def test_exit_stops_every_process_tree(tmp_path: Path) -> None:
    with ProcessGroup(tmp_path, dict(os.environ)) as procs:
        procs.start("tree", python(TREE))
        child = int(procs.wait_for_line("tree", r"child \d+", timeout=30).split()[1])
    assert all(not p.alive() for p in procs.processes.values())
    assert _gone(child)


def test_airflow_env_drops_the_sessions_airflow_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", '{"conn_type": "gpupool"}')
    env = airflow_env(
        home=tmp_path,
        metadata_url="postgresql+psycopg://db/meta",
        broker_url="redis://127.0.0.1:1/0",
        api_port=1234,
        ledger_url="postgresql://db/ledger",
        kubeconfig="/k",
        jwt_secret="s",
    )
    assert "AIRFLOW__CORE__UNIT_TEST_MODE" not in env
    assert "postgresql://db/ledger" in env["AIRFLOW_CONN_GPUPOOL_DEFAULT"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:1234/execution/"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(Path(__file__).resolve().parents[3])


def _gone(pid: int, timeout: float = 10) -> bool:
    """Return whether ``pid`` ended (or is a zombie) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False
