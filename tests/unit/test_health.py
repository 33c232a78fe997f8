"""The health endpoints the kubelet probes: ``/healthz`` fails once a loop is stuck, ``/readyz`` after a first pass."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from airflow_gpupool.health import MIN_STALE_AFTER, LoopHealth, serve_health, stale_after_for
from tests.ledger_fixtures import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def health(clock: FakeClock) -> LoopHealth:
    return LoopHealth(60, clock=clock)


@pytest.fixture
def base_url(health: LoopHealth) -> Iterator[str]:
    server = serve_health(health, 0, "127.0.0.1")
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_not_ready_but_alive_before_the_first_pass(base_url: str) -> None:
    assert get(f"{base_url}/readyz") == (503, "not ready: no pass yet\n")
    assert get(f"{base_url}/healthz") == (200, "starting: no pass yet\n")


def test_ready_and_alive_after_a_pass(base_url: str, health: LoopHealth, clock: FakeClock) -> None:
    health.beat()
    clock.advance(60)
    assert get(f"{base_url}/readyz") == (200, "ready\n")
    assert get(f"{base_url}/healthz") == (200, "ok: last pass 60s ago\n")


def test_a_loop_without_a_pass_for_longer_than_stale_after_fails_liveness(
    base_url: str, health: LoopHealth, clock: FakeClock
) -> None:
    health.beat()
    clock.advance(61)
    assert get(f"{base_url}/healthz") == (503, "stuck: last pass 61s ago (more than 60s)\n")
    # Ready stays true: a stuck loop is restarted by liveness, not taken out of a Service.
    assert get(f"{base_url}/readyz")[0] == 200
    health.beat()
    assert get(f"{base_url}/healthz")[0] == 200


def test_an_unknown_path_is_404(base_url: str) -> None:
    assert get(f"{base_url}/metrics")[0] == 404


@pytest.mark.parametrize(("interval", "expected"), [(0.5, MIN_STALE_AFTER), (30, MIN_STALE_AFTER), (60, 240)])
def test_stale_after_is_four_of_the_longest_waits_and_never_under_the_floor(
    interval: float, expected: float
) -> None:
    assert stale_after_for(interval) == expected


def test_a_non_positive_stale_after_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        LoopHealth(0)
