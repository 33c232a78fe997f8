"""Pytest fixtures for testing GPU DAGs, registered by the package's ``pytest11`` entry point.

``gpupool_ledger``
    a fresh SQLite ledger in the test's temporary directory, named by
    ``AIRFLOW_CONN_GPUPOOL_DEFAULT`` (so ``GpuPodOperator`` and ``gpupool`` find it).
``gpu_cluster``
    a function: ``gpu_cluster(nodes=[...])`` puts pools or nodes into the session's Kubernetes
    emulator, syncs them into ``gpupool_ledger`` and sets the connections ``dag.test()`` reads;
    it returns the :class:`~airflow_gpupool.testkit.cluster.GpuCluster`.
``gpupool_airflow_db``
    Airflow's metadata database migrated once per session (``dag.test()`` needs it).
``gpupool_emulator``
    the session's Kubernetes emulator that ``gpu_cluster`` resets and fills (for the bare
    emulator without a ledger, :mod:`airflow_gpupool.testing.pytest_plugin` has ``k8s_emulator``).

Every import is inside a fixture: loading the plugin costs nothing and needs no optional package.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger
    from airflow_gpupool.testing.server import KubernetesEmulatorServer
    from airflow_gpupool.testkit.cluster import GpuCluster, NodeSpec


@pytest.fixture(scope="session")
def gpupool_airflow_db() -> None:
    """Migrate Airflow's metadata database (``airflow db migrate``) once for the session.

    A subprocess, as Airflow's CLI runs it: migrating inside the test process would configure
    Airflow's ORM before the test's environment is set.
    """
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    )
    if done.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{done.stdout}\n{done.stderr}")


@pytest.fixture(scope="session")
def gpupool_emulator() -> Iterator[KubernetesEmulatorServer]:
    """Serve one Kubernetes emulator for the session; ``gpu_cluster`` gives it each test's nodes."""
    from airflow_gpupool.testing.server import KubernetesEmulatorServer

    with KubernetesEmulatorServer(default_duration_seconds=0.3) as server:
        yield server


@pytest.fixture
def gpupool_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    """Create an empty SQLite ledger for this test and name it in ``AIRFLOW_CONN_GPUPOOL_DEFAULT``.

    :param tmp_path: pytest's temporary directory
    :param monkeypatch: restores the environment after the test
    """
    from airflow_gpupool.ledger import Ledger
    from airflow_gpupool.testkit.cluster import ledger_connection

    ledger = Ledger.create(f"sqlite:///{tmp_path}/gpupool-ledger.db")
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", ledger_connection(ledger.url, {}))
    monkeypatch.delenv("GPUPOOL_LEDGER_URL", raising=False)
    try:
        yield ledger
    finally:
        ledger.close()


class _Environment:
    """``os.environ``-like writes through ``monkeypatch``, undone after the test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._monkeypatch = monkeypatch

    def __setitem__(self, name: str, value: str) -> None:
        self._monkeypatch.setenv(name, value)


@pytest.fixture
def gpu_cluster(
    gpupool_airflow_db: None,
    gpupool_emulator: KubernetesEmulatorServer,
    gpupool_ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[..., GpuCluster]:
    """Return ``gpu_cluster(nodes=None, poll_interval=0.2)``, which sets up the emulated cluster and its ledger.

    :param gpupool_airflow_db: Airflow's metadata database, migrated
    :param gpupool_emulator: the session's emulator (reset with the nodes asked for)
    :param gpupool_ledger: this test's ledger
    :param monkeypatch: restores the environment after the test
    """
    from airflow_gpupool.testkit.cluster import GpuCluster

    cluster = GpuCluster(gpupool_emulator, gpupool_ledger, _Environment(monkeypatch))  # type: ignore[arg-type]

    def configure(nodes: Iterable[NodeSpec] | None = None, **kwargs: Any) -> GpuCluster:
        return cluster.configure(nodes, **kwargs)

    return configure
