"""``gpupool traces fetch`` against a local HTTP server, ``gpupool traces synth``, and where traces are read from."""

from __future__ import annotations

import functools
import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_gpupool.cli import main
from airflow_gpupool.exceptions import ConfigurationError, TraceFetchError
from airflow_gpupool.sim.fetch import FILES, TRACE_SET, cache_dir, fetch, trace_root
from airflow_gpupool.sim.replay import replay
from airflow_gpupool.sim.synth import synthesize
from airflow_gpupool.sim.trace import NODE_LIST, TRACES, load_nodes, load_pods


class Upstream:
    """A local HTTP server standing in for the upstream repository; it counts the requests."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        upstream = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                upstream.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(root))
        )
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[tuple[Upstream, dict[str, str]]]:
    """Serve a generated trace; return the server and the SHA-256 of each file (the pins)."""
    synthesize(tmp_path / "served", nodes=10, pods=50, seed=3)
    root = tmp_path / "served" / TRACE_SET
    pins = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}
    server = Upstream(root)
    yield server, pins
    server.close()


def test_fetch_downloads_checks_and_keeps_intact_files(
    upstream: tuple[Upstream, dict[str, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, pins = upstream
    seen: list[tuple[str, int, int | None]] = []

    paths = fetch(tmp_path / "dl", base_url=server.url, files=pins, progress=lambda *a: seen.append(a))

    assert [p.name for p in paths] == list(pins)
    assert all(hashlib.sha256(p.read_bytes()).hexdigest() == pins[p.name] for p in paths)
    assert {name for name, _, _ in seen} == set(pins)
    last = {name: (done, total) for name, done, total in seen}
    assert all(done == total for done, total in last.values())
    assert len(server.requests) == len(pins)
    # Fetched again: nothing is downloaded; a damaged file is downloaded again.
    fetch(tmp_path / "dl", base_url=server.url, files=pins)
    assert len(server.requests) == len(pins)
    paths[0].write_text("damaged")
    fetch(tmp_path / "dl", base_url=server.url, files=pins)
    assert len(server.requests) == len(pins) + 1
    assert hashlib.sha256(paths[0].read_bytes()).hexdigest() == pins[paths[0].name]


def test_a_file_that_is_not_the_pinned_one_is_refused_and_not_kept(
    upstream: tuple[Upstream, dict[str, str]], tmp_path: Path
) -> None:
    server, pins = upstream
    wrong = {name: "0" * 64 for name in list(pins)[:1]}

    with pytest.raises(TraceFetchError, match="SHA-256 is .* expected 0000"):
        fetch(tmp_path / "dl", base_url=server.url, files=wrong)

    assert list((tmp_path / "dl" / TRACE_SET).iterdir()) == []  # no partial file either


def test_an_unreachable_upstream_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(TraceFetchError, match="download failed"):
        fetch(tmp_path, base_url="http://127.0.0.1:9/nothing", files={"x.csv": "0" * 64})


def test_the_command_fetches_into_the_cache_with_a_progress_bar(
    upstream: tuple[Upstream, dict[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server, pins = upstream
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("GPUPOOL_TRACE_DIR", raising=False)
    monkeypatch.setattr("airflow_gpupool.sim.fetch.FILES", pins)

    assert main(["traces", "fetch", "--base-url", server.url]) == 0

    out, err = capsys.readouterr()
    assert cache_dir() == tmp_path / "cache" / "airflow-gpupool" / "traces"
    assert f"GPUPOOL_TRACE_DIR={cache_dir()}" in out
    assert "100%" in err and "[" in err
    # gpupool simulate without --pods now reads the cache.
    assert trace_root(NODE_LIST) == cache_dir() / TRACE_SET
    assert len(load_nodes()) == 10


def test_the_pins_name_every_file_the_simulator_reads() -> None:
    assert set(FILES) == {NODE_LIST, *TRACES.values()}
    assert all(len(sha) == 64 for sha in FILES.values())


def test_without_a_trace_the_message_says_how_to_fetch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("GPUPOOL_TRACE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    with pytest.raises(ConfigurationError, match="run `gpupool traces fetch`"):
        load_pods("default")
    assert main(["simulate", "--quiet"]) == 2


def test_the_trace_dir_may_name_the_trace_folder_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    synthesize(tmp_path, nodes=5, pods=20)
    monkeypatch.setenv("GPUPOOL_TRACE_DIR", str(tmp_path / TRACE_SET))

    assert len(load_nodes()) == 5


def test_synth_writes_every_named_trace_and_the_simulator_runs_on_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["traces", "synth", "--dir", str(tmp_path), "--nodes", "30", "--pods", "200", "--seed", "1"])
        == 0
    )
    monkeypatch.setenv("GPUPOOL_TRACE_DIR", str(tmp_path))

    nodes = load_nodes()
    traces = {name: load_pods(name) for name in TRACES}

    assert len(nodes) == 30 and all(len(p) == 200 for p in traces.values())
    share = traces["gpushare100"]
    assert all(p.request.gpu_milli is not None for p in share if p.request.total_gpu_milli)
    assert sum(p.request.gpus > 1 for p in traces["multigpu50"]) > 50
    assert any(p.request.gpu_models for p in traces["gpuspec33"])
    assert replay(nodes, traces["default"], "gpupool", 42).pods > 0
    first = (tmp_path / TRACE_SET / NODE_LIST).read_bytes()
    synthesize(tmp_path, nodes=30, pods=200, seed=1)
    assert (tmp_path / TRACE_SET / NODE_LIST).read_bytes() == first  # seeded


def test_synth_refuses_an_empty_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["traces", "synth", "--dir", str(tmp_path), "--nodes", "0"]) == 2
    assert "nodes and pods must be positive" in capsys.readouterr().err
