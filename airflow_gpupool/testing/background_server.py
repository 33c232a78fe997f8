"""Serve the Kubernetes API emulator over HTTP from a background thread with its own event loop.

Blocking clients such as ``KubernetesPodOperator`` (the ``kubernetes`` package) and async ones
(``kubernetes_asyncio``) can both talk to it, while the test's own thread reaches the emulator's
objects by running calls on the server's loop and waiting for the answer. What tests do with the
running emulator is :class:`~airflow_gpupool.testing.server.KubernetesEmulatorServer`'s job.
"""

from __future__ import annotations

import asyncio
import copy
import tempfile
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from airflow_gpupool.testing.api.apiserver import KubernetesApiEmulator
from airflow_gpupool.testing.cluster.nodes import default_nodes
from airflow_gpupool.testing.cluster.provisioner import ScalableNodePool
from airflow_gpupool.testing.kubeconfig import write_kubeconfig

T = TypeVar("T")


def _quiet_test_server() -> Any:
    """Return an aiohttp raw test server class that writes no access log."""
    from aiohttp.test_utils import RawTestServer
    from aiohttp.web_runner import ServerRunner
    from aiohttp.web_server import Server

    class QuietRawTestServer(RawTestServer):
        async def _make_runner(self, debug: bool = True, **kwargs: Any) -> ServerRunner:
            server = Server(self._handler, loop=self._loop, debug=debug, access_log=None, **kwargs)
            return ServerRunner(server, debug=debug, **kwargs)

    return QuietRawTestServer


class BackgroundEmulatorServer:
    """Serve a Kubernetes API emulator from a thread: start, stop, and run calls on its loop.

    :param nodes: Node objects (see :func:`~airflow_gpupool.testing.gpu_node`); a small default
        cluster when ``None``
    :param host: interface to listen on
    :param port: TCP port; 0 picks a free one
    :param kubeconfig_path: where to write the kubeconfig; a temporary file when ``None``
    :param namespace: the kubeconfig context's namespace
    :param default_duration_seconds: how long containers run unless told otherwise
    :param access_log: log every request through the ``aiohttp.access`` logger
    :param scalable_pools: node pools the emulator's provisioner grows and shrinks
    :param unserved_groups: API groups the emulated cluster lacks (e.g. ``autoscaling.x-k8s.io``);
        ``None``: Karpenter's ``karpenter.sh``
    """

    def __init__(
        self,
        nodes: Iterable[Mapping[str, Any]] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        kubeconfig_path: str | Path | None = None,
        namespace: str = "default",
        default_duration_seconds: float = 0.5,
        access_log: bool = False,
        scalable_pools: Iterable[ScalableNodePool] = (),
        unserved_groups: Iterable[str] | None = None,
    ) -> None:
        self.access_log = access_log
        self.scalable_pools = tuple(scalable_pools)
        self.unserved_groups = None if unserved_groups is None else tuple(unserved_groups)
        self.initial_nodes = [copy.deepcopy(dict(n)) for n in (default_nodes() if nodes is None else nodes)]
        self.host = host
        self._requested_port = port
        self._kubeconfig_path = Path(kubeconfig_path) if kubeconfig_path else None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self.namespace = namespace
        self.default_duration_seconds = default_duration_seconds
        self.api: KubernetesApiEmulator | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._port: int | None = None
        self._error: BaseException | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> Self:
        """Start serving and write the kubeconfig; return ``self``."""
        if self._thread is not None:
            raise RuntimeError("the emulator is already running")
        self._ready.clear()
        self._thread = threading.Thread(target=self._thread_main, name="gpupool-k8s-emulator", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._error is not None or self._port is None:
            self._thread.join(timeout=5)
            self._thread = None
            raise RuntimeError("the Kubernetes emulator did not start") from self._error
        if self._kubeconfig_path is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="gpupool-emulator-")
            self._kubeconfig_path = Path(self._tmpdir.name) / "kubeconfig"
        write_kubeconfig(self._kubeconfig_path, self.url, self.namespace)
        return self

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._thread is None or self._loop is None or self._stop is None:
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)
        self._thread = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None
            self._kubeconfig_path = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _thread_main(self) -> None:
        """Run the server's event loop until :meth:`stop`."""
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as e:  # reported to start()
            self._error = e
        finally:
            self._ready.set()
            loop.close()

    async def _serve(self) -> None:
        """Serve until the stop event is set."""
        from kmock import Server

        self._stop = asyncio.Event()
        self.api = KubernetesApiEmulator(
            nodes=self.initial_nodes,
            default_duration_seconds=self.default_duration_seconds,
            scalable_pools=self.scalable_pools,
            unserved_groups=self.unserved_groups,
        )
        extra: dict[str, Any] = {} if self.access_log else {"server_cls": _quiet_test_server()}
        async with (
            self.api,
            Server(self.api, host=self.host, port=self._requested_port or None, **extra) as server,
        ):
            self._port = server.port
            self.api.provisioner.start()
            self._ready.set()
            await self._stop.wait()
            await self.api.provisioner.shutdown()
            await self.api.jobs.shutdown()
            await self.api.terminations.shutdown()
            await self.api.kubelet.shutdown()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run a coroutine on the server's loop and return its result.

        :param coro: the coroutine
        :param timeout: seconds to wait
        """
        if self._loop is None or self._thread is None:
            coro.close()
            raise RuntimeError("the emulator is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _run_sync(self, fn: Callable[[KubernetesApiEmulator], T]) -> T:
        """Run a function of the API emulator on the server's loop.

        :param fn: the function
        """

        async def call() -> T:
            assert self.api is not None
            return fn(self.api)

        return self._call(call())

    # -- connection ----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port the server listens on."""
        if self._port is None:
            raise RuntimeError("the emulator is not running")
        return self._port

    @property
    def url(self) -> str:
        """The server URL, e.g. ``http://127.0.0.1:34567``."""
        return f"http://{self.host}:{self.port}"

    @property
    def kubeconfig_path(self) -> str:
        """Path of the kubeconfig file pointing at this server."""
        if self._kubeconfig_path is None:
            raise RuntimeError("the emulator is not running")
        return str(self._kubeconfig_path)
