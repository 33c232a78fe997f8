"""``gpupool metrics serve``: the standalone exporter, scraped over HTTP like Prometheus does."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from airflow_gpupool.cli import build_parser
from airflow_gpupool.cli.metrics import cmd_metrics_serve, serve
from tests.unit.metrics.scenario import build_pool


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cli_parses_metrics_serve() -> None:
    args = build_parser().parse_args(["metrics", "serve", "--port", "9999", "--url", "sqlite:////tmp/x.db"])
    assert (args.func, args.port, args.url, args.bind) == (
        cmd_metrics_serve,
        9999,
        "sqlite:////tmp/x.db",
        "127.0.0.1",  # loopback unless told: an exporter has no login
    )
    chosen = build_parser().parse_args(["metrics", "serve", "--bind", "0.0.0.0", "--port", "9464"])
    assert (chosen.bind, chosen.port) == ("0.0.0.0", 9464)


@pytest.mark.timeout(30)
def test_exporter_serves_the_ledger_metrics(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    build_pool(url).ledger.close()
    port = _free_port()
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(port, url, "127.0.0.1", stop), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    text = response.read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        stop.set()
        thread.join(timeout=10)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("gpupool_ledger_up", ())] == 1
    assert samples[("gpupool_gpu_capacity_milli", (("model", "A100"), ("node_pool", "train")))] == 2000
    assert samples[("gpupool_gpu_allocated_milli", (("model", "A100"), ("node_pool", "train")))] == 1250
    assert samples[("gpupool_reservations_total", (("state", "expired"),))] == 1
    assert samples[("gpupool_lease_expiries_total", ())] == 1
    assert samples[("gpupool_queue_requests", ())] == 2
    assert not thread.is_alive()


@pytest.mark.timeout(30)
def test_exporter_listens_only_where_it_is_bound(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    build_pool(url).ledger.close()
    port = _free_port()
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(port, url, "127.0.0.1", stop), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        listening = [
            c
            for c in psutil.net_connections("tcp")
            if c.laddr and c.laddr.port == port and c.status == "LISTEN"
        ]
        assert {c.laddr.ip for c in listening} == {"127.0.0.1"}
    finally:
        stop.set()
        thread.join(timeout=10)
