"""Pytest fixtures for the Kubernetes emulator.

Register with ``pytest_plugins = ["airflow_gpupool.testing.pytest_plugin"]`` in a root
``conftest.py``. ``k8s_emulator`` is one server for the whole session; ``k8s_emulator_clean``
is the same server reset (no pods, events, rules or logged requests; initial nodes) before the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_gpupool.testing.server import KubernetesEmulatorServer


@pytest.fixture(scope="session")
def k8s_emulator() -> Iterator[KubernetesEmulatorServer]:
    """Serve the emulator with the default GPU nodes for the whole session."""
    with KubernetesEmulatorServer() as server:
        yield server


@pytest.fixture
def k8s_emulator_clean(k8s_emulator: KubernetesEmulatorServer) -> KubernetesEmulatorServer:
    """Return the session's emulator after a :meth:`~KubernetesEmulatorServer.reset`.

    :param k8s_emulator: the session's emulator
    """
    k8s_emulator.reset()
    return k8s_emulator
