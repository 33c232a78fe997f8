"""``gpupool agent run``: the node agent, one per GPU node (the nvml-agent DaemonSet)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from airflow_gpupool import settings
from airflow_gpupool.argtypes import non_empty, number
from airflow_gpupool.cli.common import health_args, logger_level, open_ledger, print_json, url_arg
from airflow_gpupool.exceptions import ConfigurationError, NoGpuError

__all__ = ["EXIT_NO_GPU", "cmd_agent_run", "make_collector", "register"]

log = logging.getLogger(__name__)

#: The exit code when the node has no GPU, driver or NVML permission (not a crash: a wrong node).
EXIT_NO_GPU = 3


def make_collector(backend: str, node: str, fake_spec: str | None) -> Any:
    """Build the collector of a backend: ``nvml`` (the real ``pynvml``) or ``fake`` (a YAML spec)."""
    from airflow_gpupool.agent.collect import NvmlCollector

    if backend == "fake":
        if not fake_spec:
            raise ConfigurationError(
                "--backend fake needs --fake-spec FILE (a YAML of GPUs, see testing/fake_nvml.py)"
            )
        import yaml

        from airflow_gpupool.testing.fake_nvml import FakeNvml

        # A spec that vanishes later is a driver gone (what the fake is for); one that is not
        # there at the start is a wrong path, named as such.
        if not Path(fake_spec).is_file():
            raise ConfigurationError(f"--fake-spec {fake_spec!r}: no such file (a YAML of GPUs)")
        try:
            fake = FakeNvml(fake_spec)
        except (OSError, ValueError, yaml.YAMLError) as e:  # UnicodeDecodeError is a ValueError
            raise ConfigurationError(f"--fake-spec {fake_spec!r} is not a fake NVML spec: {e}") from e
        return NvmlCollector(fake, node, pod_uid_of=fake.pod_uid_of)
    if fake_spec:
        raise ConfigurationError("--fake-spec is only read with --backend fake")
    import pynvml

    return NvmlCollector(pynvml, node)


def cmd_agent_run(args: argparse.Namespace) -> int:
    """Report this node's GPUs (UUIDs, memory, utilization, health, processes, XIDs) to the ledger.

    Each interval it writes a heartbeat with the report; the controller quarantines a node whose
    heartbeats stop. With --once it samples and writes once; --json prints the report. A node
    with no GPU or driver exits 3 with a message.
    """
    with logger_level("airflow_gpupool", logging.INFO):
        return _run_agent(args)


def _run_agent(args: argparse.Namespace) -> int:
    from airflow_gpupool.agent.run import NodeAgent
    from airflow_gpupool.health import LoopHealth, serve_health, stale_after_for

    interval = args.interval if args.interval is not None else settings.agent_interval_seconds()
    collector = make_collector(args.backend, args.node, args.fake_spec)
    try:
        collector.open()
    except NoGpuError as e:
        print(f"gpupool agent: {e}", file=sys.stderr)
        return EXIT_NO_GPU
    ledger = None if args.no_ledger else open_ledger(args)
    try:
        health = LoopHealth(stale_after_for(interval))
        agent = NodeAgent(collector, ledger, interval, health=health)
        if args.once:
            outcome = agent.run_pass()
            if args.json:
                print_json(outcome.to_dict())
            elif outcome.error is None:
                print(f"{args.node}: {len(outcome.report.gpus)} GPU(s) reported")
            return 1 if outcome.error else 0
        stop = threading.Event()

        def on_signal(signum: int, _frame: Any) -> None:
            log.info("Received %s: stopping", signal.Signals(signum).name)
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        log.info("Agent of %s: %s backend, every %gs", args.node, args.backend, interval)
        server = (
            None if args.health_port is None else serve_health(health, args.health_port, args.health_bind)
        )
        try:
            agent.run(stop)
        finally:
            if server is not None:
                server.shutdown()
        return 0
    finally:
        collector.close()
        if ledger is not None:
            ledger.close()


def register(subparsers: Any) -> None:
    """Add ``gpupool agent run``.

    :param subparsers: the top-level subparsers
    """
    group = subparsers.add_parser("agent", help="the node agent: GPUs, health and heartbeats through NVML")
    actions = group.add_subparsers(dest="agent_command", metavar="ACTION")
    actions.required = True
    p = actions.add_parser("run", help="run the node agent", description=cmd_agent_run.__doc__)
    url_arg(p)
    p.add_argument(
        "--node", type=non_empty, required=True, help="this node's name, as the ledger's inventory has it"
    )
    p.add_argument(
        "--interval",
        metavar="S",
        type=number(0, above=True),
        help="seconds between heartbeats (default: [gpupool] agent_interval_seconds, 30)",
    )
    p.add_argument("--once", action="store_true", help="sample and write one heartbeat, then exit")
    p.add_argument("--json", action="store_true", help="with --once: print the report as JSON")
    p.add_argument("--no-ledger", action="store_true", help="write nothing: only sample (with --once --json)")
    p.add_argument(
        "--backend",
        choices=["nvml", "fake"],
        default="nvml",
        help="nvml: the GPUs through nvidia-ml-py (default); fake: the GPUs of --fake-spec",
    )
    p.add_argument(
        "--fake-spec", metavar="FILE", help="with --backend fake: a YAML of GPUs (testing/fake_nvml.py)"
    )
    health_args(p)
    p.set_defaults(func=cmd_agent_run)
