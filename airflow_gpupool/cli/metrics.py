"""``gpupool metrics serve``: the Prometheus exporter of the ledger.

Unauthenticated, as exporters are, so Prometheus can scrape it; it binds to loopback unless
told where (``--bind 0.0.0.0`` in a container or pod, where the network policy is the fence).
The plugin's ``/gpupool/metrics`` stays behind Airflow's login and is for people, not scrapers.
"""

from __future__ import annotations

import argparse
import logging
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from airflow_gpupool.cli.common import PodLister

from airflow_gpupool.argtypes import bind_address, port
from airflow_gpupool.cli.cluster import cluster_pods
from airflow_gpupool.cli.common import url_arg
from airflow_gpupool.exceptions import GpuPoolError

log = logging.getLogger(__name__)


def make_registry(url: str | None = None, pods: PodLister | None = None) -> CollectorRegistry:
    """Return a registry holding a :class:`GpuPoolCollector` for the ledger at ``url``.

    :param url: ledger URL; default from :func:`airflow_gpupool.settings.ledger_url`
    :param pods: lists every pod in the cluster: the drift gauge is exported too
    """
    from prometheus_client import CollectorRegistry

    from airflow_gpupool.hooks.gpupool import resolve_ledger_url
    from airflow_gpupool.ledger import Ledger
    from airflow_gpupool.metrics.collector import GpuPoolCollector
    from airflow_gpupool.metrics.drift import LedgerDriftCollector

    ledger = Ledger(resolve_ledger_url(url))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuPoolCollector(ledger))
    if pods is not None:
        registry.register(LedgerDriftCollector(ledger, pods))
    return registry


DEFAULT_BIND = "127.0.0.1"


def serve(
    port: int,
    url: str | None = None,
    addr: str = DEFAULT_BIND,
    stop: threading.Event | None = None,
    pods: PodLister | None = None,
) -> None:
    """Serve ``/metrics`` on ``addr:port`` until ``stop`` is set (forever when None).

    :param port: TCP port
    :param url: ledger URL; default from :func:`airflow_gpupool.settings.ledger_url`
    :param addr: address to bind
    :param stop: set it to shut the server down (tests)
    :param pods: lists every pod in the cluster: the drift gauge is exported too
    """
    from prometheus_client import start_http_server

    registry = make_registry(url, pods)
    try:
        server, thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as e:  # a name that does not resolve (socket.gaierror), a port in use
        raise GpuPoolError(f"cannot serve metrics on {addr}:{port}: {e.strerror or e}") from e
    log.info("Serving GPU pool metrics on http://%s:%d/metrics", addr, port)
    try:
        (stop or threading.Event()).wait()
    finally:
        server.shutdown()
        thread.join()


def cmd_metrics_serve(args: argparse.Namespace) -> int:
    """Serve the ledger's Prometheus metrics over HTTP (``/metrics``)."""
    pods = cluster_pods(args.kubeconfig, args.context) if args.drift else None
    try:
        serve(args.port, args.url, args.bind, pods=pods)
    except KeyboardInterrupt:
        pass
    return 0


def register(subparsers: Any) -> None:
    """Add ``gpupool metrics serve``.

    :param subparsers: what ``add_subparsers()`` returned for the ``gpupool`` command
    """
    metrics = subparsers.add_parser("metrics", help="Prometheus metrics of the ledger")
    sub = metrics.add_subparsers(dest="metrics_command", metavar="WHAT")
    sub.required = True
    p = sub.add_parser("serve", help="serve /metrics over HTTP", description=cmd_metrics_serve.__doc__)
    p.add_argument("--port", type=port, default=9464, help="TCP port, 1-65535 (default: 9464)")
    p.add_argument(
        "--bind",
        "--addr",
        dest="bind",
        type=bind_address,
        default=DEFAULT_BIND,
        metavar="ADDR",
        help=f"address to listen on; 0.0.0.0 for every interface (default: {DEFAULT_BIND})",
    )
    p.add_argument(
        "--drift",
        action="store_true",
        help="also export gpupool_ledger_drift_gpus{node}: each scrape lists every pod of the cluster",
    )
    p.add_argument(
        "--kubeconfig",
        metavar="F",
        help="with --drift: kubeconfig file (default: KUBECONFIG, ~/.kube/config, in-cluster)",
    )
    p.add_argument(
        "--context", metavar="C", help="with --drift: kubeconfig context (default: the current one)"
    )
    url_arg(p)
    p.set_defaults(func=cmd_metrics_serve)
