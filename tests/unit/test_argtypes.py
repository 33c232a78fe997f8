"""The ``gpupool`` argument types: what each takes and what it refuses, table-driven."""

from __future__ import annotations

import argparse

import pytest

from airflow_gpupool.argtypes import bind_address


@pytest.mark.parametrize(
    "text", ["127.0.0.1", "0.0.0.0", "::1", "::", "localhost", "metrics.gpupool.svc", "node-1.local."]
)
def test_a_bind_address_is_an_ip_or_a_host_name(text: str) -> None:
    assert bind_address(text) in (text, str(text))


@pytest.mark.parametrize(
    "text", ["", " ", "not an ip", "999.1.1.1", "1.2.3", "-a", "a..b", "a_b", "x" * 64, "host:80"]
)
def test_anything_else_is_refused_by_argparse(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not an IP address or a host name"):
        bind_address(text)
