"""The bare emulator's fixtures come with the kit's entry point: no conftest.py line (issue 37)."""

from __future__ import annotations

from typing import Any

import pytest


def _names(k8s: Any) -> list[str]:
    return sorted(n["metadata"]["name"] for n in k8s.nodes())


def test_k8s_emulator_clean_is_the_session_server_with_its_nodes_back(request: pytest.FixtureRequest) -> None:
    # Loaded by fixture name, as a DAG author's test would: the fixtures come from the entry point.
    server = request.getfixturevalue("k8s_emulator")
    initial = _names(server)
    assert initial, "the session's server starts with the default GPU nodes"
    server.delete_node(initial[0])
    assert _names(request.getfixturevalue("k8s_emulator_clean")) == initial
