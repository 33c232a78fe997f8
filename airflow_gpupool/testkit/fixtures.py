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
    the session's Kubernetes emulator that ``gpu_cluster`` resets and fills.
``k8s_emulator``, ``k8s_emulator_clean``
    the bare emulator, without a ledger: one server with the default GPU nodes for the session,
    and the same server reset before the test.

pytest loads this module through the entry point, so no ``conftest.py`` line is needed. Its hooks
give the session a temporary ``AIRFLOW_HOME`` unless the user set one
(:mod:`airflow_gpupool.testkit.home`). Every other import is inside a fixture: loading the plugin
costs nothing and needs no optional package.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from airflow_gpupool.testkit.home import AirflowHome, isolate_airflow_home

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger
    from airflow_gpupool.testing.server import KubernetesEmulatorServer
    from airflow_gpupool.testkit.cluster import GpuCluster, NodeSpec


_HOME = pytest.StashKey[AirflowHome]()


def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Isolate ``AIRFLOW_HOME`` before any ``conftest.py`` or test module can import Airflow.

    :param early_config: the session's configuration, where the home is kept until the end
    """
    early_config.stash[_HOME] = isolate_airflow_home()


def pytest_configure(config: pytest.Config) -> None:
    """Isolate ``AIRFLOW_HOME`` when the plugin came too late for the first hook.

    A ``pytest_plugins`` line in a ``conftest.py`` registers the plugin after pytest called
    ``pytest_load_initial_conftests``; Airflow may be imported by then, which
    :func:`~airflow_gpupool.testkit.home.isolate_airflow_home` reports.

    :param config: the session's configuration
    """
    if _HOME not in config.stash:
        config.stash[_HOME] = isolate_airflow_home()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the session's temporary ``AIRFLOW_HOME`` (a home the user set is left alone).

    :param config: the session's configuration
    """
    home = config.stash.get(_HOME, None)
    if home is not None:
        home.close()
        del config.stash[_HOME]


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


@pytest.fixture(scope="session")
def k8s_emulator() -> Iterator[KubernetesEmulatorServer]:
    """Serve the emulator with the default GPU nodes for the whole session."""
    from airflow_gpupool.testing.server import KubernetesEmulatorServer

    with KubernetesEmulatorServer() as server:
        yield server


@pytest.fixture
def k8s_emulator_clean(k8s_emulator: KubernetesEmulatorServer) -> KubernetesEmulatorServer:
    """Return the session's emulator after a :meth:`~KubernetesEmulatorServer.reset`.

    :param k8s_emulator: the session's emulator
    """
    k8s_emulator.reset()
    return k8s_emulator


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
