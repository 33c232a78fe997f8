"""``gpupool controller run``: the one long-running process with Kubernetes access."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
import uuid
from pathlib import Path
from typing import Any

from airflow_gpupool.argtypes import non_empty, number
from airflow_gpupool.cli.common import health_args, logger_level, open_ledger, url_arg
from airflow_gpupool.controller.leader import DEFAULT_LEASE_DURATION, DEFAULT_LEASE_NAME
from airflow_gpupool.controller.run import (
    DEFAULT_AUTOSCALE_INTERVAL,
    DEFAULT_GATE_INTERVAL,
    DEFAULT_RECONCILE_INTERVAL,
    DEFAULT_SYNC_INTERVAL,
)

__all__ = ["cmd_controller_run", "default_namespace", "register"]

log = logging.getLogger(__name__)

_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def default_namespace() -> str:
    """Return the Lease's namespace: ``POD_NAMESPACE``, else the pod's own (in-cluster), else ``default``."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    if _SERVICE_ACCOUNT_NAMESPACE.is_file():
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    return "default"


def cmd_controller_run(args: argparse.Namespace) -> int:
    """Sync the inventory, reconcile grants with their pods and reap expired leases, on intervals.

    Replicas elect one leader through a Kubernetes Lease; only the leader acts. SIGTERM or SIGINT
    stops the loop and releases the Lease.
    """
    with logger_level("airflow_gpupool", args.log_level):
        return _run_controller(args)


def _run_controller(args: argparse.Namespace) -> int:
    from kubernetes import client

    from airflow_gpupool.controller.leader import LeaderElector, LeaseSettings
    from airflow_gpupool.controller.run import ControllerIntervals, GpuPoolController
    from airflow_gpupool.health import LoopHealth, serve_health, stale_after_for
    from airflow_gpupool.inventory.sync import core_v1_api
    from airflow_gpupool.settings import forecast_interval_seconds

    # Bad configuration fails here, before the loop: exit 2 (GpuPoolError) or a traceback.
    intervals = ControllerIntervals(
        sync=args.sync_interval,
        reconcile=args.reconcile_interval,
        gate=args.gate_interval,
        autoscale=args.autoscale_interval,
        forecast=forecast_interval_seconds(),
    )
    lease = LeaseSettings(
        namespace=args.namespace or default_namespace(),
        identity=args.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
        name=args.lease_name,
        lease_duration=args.lease_duration,
    )
    core = core_v1_api(args.kubeconfig, args.context)
    elector = LeaderElector(client.CoordinationV1Api(core.api_client), lease)
    autoscaler = _autoscaler(core, lease.namespace)
    ledger = open_ledger(args)
    health = LoopHealth(stale_after_for(max(intervals.sync, intervals.reconcile, lease.lease_duration)))
    controller = GpuPoolController(
        ledger,
        core,
        elector,
        intervals,
        count_external_pods=not args.no_external_pods,
        pod_relist_seconds=args.pod_relist_interval,
        autoscaler=autoscaler(ledger) if autoscaler else None,
        health=health,
    )
    server = None if args.health_port is None else serve_health(health, args.health_port, args.health_bind)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("Received %s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "Controller %s: Lease %s/%s (%gs), sync every %gs, reconcile every %gs, ledger %s",
        lease.identity,
        lease.namespace,
        lease.name,
        lease.lease_duration,
        intervals.sync,
        intervals.reconcile,
        ledger.display_url,
    )
    try:
        if args.once:
            result = controller.run_once(wait=stop.wait)
            return 1 if result.errors else 0
        controller.run(stop)
    finally:
        if server is not None:
            server.shutdown()
        ledger.close()
    log.info("Controller %s stopped", lease.identity)
    return 0


def _autoscaler(core: Any, namespace: str) -> Any:
    """Return a maker of the autoscale step from ``[gpupool]``, or ``None`` when no pool is scalable.

    Bad options raise :class:`~airflow_gpupool.exceptions.ConfigurationError` here, before the loop.

    :param core: the ``CoreV1Api``
    :param namespace: the controller's namespace (the default for its objects)
    """
    from airflow_gpupool import settings
    from airflow_gpupool.controller.autoscale.pools import parse_scalable_pools
    from airflow_gpupool.controller.autoscale.step import Autoscaler, AutoscaleSettings
    from airflow_gpupool.exceptions import ConfigurationError

    pools = parse_scalable_pools(settings.autoscale_option("scalable_node_pools"))
    text = settings.autoscale_option("discover_node_pools")
    discover = {part.strip() for part in text.split(",") if part.strip()}
    unknown = sorted(discover - {"karpenter", "cluster-api"})
    if unknown:
        raise ConfigurationError(
            f"[gpupool] discover_node_pools: {text!r} names {unknown}; expected a comma-separated list of "
            "karpenter and cluster-api, or empty"
        )
    chosen = AutoscaleSettings(
        pools=pools,
        namespace=settings.autoscale_option("autoscale_namespace") or namespace,
        mode=settings.autoscale_option("autoscale_mode"),
        provisioning_class=settings.autoscale_option("provisioning_class"),
        placeholder_priority_class=settings.autoscale_option("placeholder_priority_class"),
        spot_pools=settings.spot_node_pools(),
        discover_karpenter="karpenter" in discover,
        discover_cluster_api="cluster-api" in discover,
    )
    if not pools and not discover:
        return None
    return lambda ledger: Autoscaler(ledger, core, chosen)


def register(subparsers: Any) -> None:
    """Add ``gpupool controller run``.

    :param subparsers: the top-level subparsers
    """
    group = subparsers.add_parser(
        "controller", help="the controller: inventory sync, reconcile and reap, leader-elected"
    ).add_subparsers(dest="controller_command", metavar="ACTION")
    group.required = True
    p = group.add_parser("run", help="run the controller loop", description=cmd_controller_run.__doc__)
    url_arg(p)
    p.add_argument(
        "--kubeconfig", metavar="F", help="kubeconfig file (default: KUBECONFIG, ~/.kube/config, in-cluster)"
    )
    p.add_argument("--context", metavar="C", help="kubeconfig context (default: the current one)")
    p.add_argument(
        "--sync-interval",
        metavar="S",
        type=number(0, above=True),
        default=DEFAULT_SYNC_INTERVAL,
        help="seconds between inventory syncs (default %(default)g)",
    )
    p.add_argument(
        "--reconcile-interval",
        metavar="S",
        type=number(0, above=True),
        default=DEFAULT_RECONCILE_INTERVAL,
        help="seconds between reconciles of grants with pods, each followed by a reap (default %(default)g)",
    )
    p.add_argument(
        "--gate-interval",
        metavar="S",
        type=number(0, above=True),
        default=DEFAULT_GATE_INTERVAL,
        help="seconds between gatekeeper passes over the pods the executor hook gated (default %(default)g)",
    )
    p.add_argument(
        "--pod-relist-interval",
        metavar="S",
        type=number(0, above=True),
        default=300.0,
        help="seconds between full lists of every pod behind the pod watch, a safety net (default %(default)g)",
    )
    p.add_argument(
        "--no-external-pods",
        action="store_true",
        help="do not watch pods nor count the GPUs of pods this project did not make (not recommended: "
        "a grant may then land on GPUs a notebook or another scheduler's pod holds)",
    )
    p.add_argument(
        "--autoscale-interval",
        metavar="S",
        type=number(0, above=True),
        default=DEFAULT_AUTOSCALE_INTERVAL,
        help="seconds between autoscale passes ([gpupool] scalable_node_pools; default %(default)g)",
    )
    p.add_argument(
        "--namespace",
        metavar="N",
        type=non_empty,
        help="the Lease's namespace (default: POD_NAMESPACE, the pod's, or default)",
    )
    p.add_argument(
        "--lease-name",
        metavar="NAME",
        type=non_empty,
        default=DEFAULT_LEASE_NAME,
        help="the Lease (default %(default)s)",
    )
    p.add_argument(
        "--lease-duration",
        metavar="S",
        type=number(0, above=True),
        default=DEFAULT_LEASE_DURATION,
        help="seconds a silent leader keeps the Lease before another takes over (default %(default)g)",
    )
    p.add_argument(
        "--identity",
        metavar="ID",
        type=non_empty,
        help="this replica's holder identity (default: hostname_random)",
    )
    p.add_argument(
        "--once", action="store_true", help="run one pass (every step) and exit: for cron and tests"
    )
    health_args(p)
    p.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING"],
        default="INFO",
        help="the controller's log level (default %(default)s; DEBUG gives each pass's details)",
    )
    p.set_defaults(func=cmd_controller_run)
