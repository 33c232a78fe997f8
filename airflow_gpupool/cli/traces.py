"""The ``gpupool traces`` commands: fetch the Alibaba GPU trace, or write a small generated one."""

from __future__ import annotations

import argparse
from typing import Any

from airflow_gpupool.exceptions import ConfigurationError

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``traces`` group (``fetch``, ``synth``) to an argparse ``subparsers`` object."""
    from airflow_gpupool.sim.fetch import BASE_URL, cache_dir

    group = subparsers.add_parser("traces", help="fetch the Alibaba GPU trace 2023, or write a generated one")
    actions = group.add_subparsers(dest="traces_command", metavar="ACTION")
    actions.required = True
    fetch = actions.add_parser(
        "fetch",
        help="download the trace files the simulator needs (pinned SHA-256) into a cache",
        description=f"Download the Alibaba GPU trace 2023 from {BASE_URL}, checking each file's pinned "
        f"SHA-256. Files already there and intact are kept. Default folder: {cache_dir()} "
        "($XDG_CACHE_HOME/airflow-gpupool/traces), which `gpupool simulate` reads when "
        "GPUPOOL_TRACE_DIR is unset.",
    )
    fetch.add_argument(
        "--dir", help="folder to download into (usable as GPUPOOL_TRACE_DIR); default: the cache"
    )
    fetch.add_argument("--base-url", default=BASE_URL, help=argparse.SUPPRESS)  # tests: a local server
    fetch.add_argument("--quiet", action="store_true", help="no progress bar")
    fetch.set_defaults(func=_fetch)
    synth = actions.add_parser(
        "synth",
        help="write a small generated trace in the Alibaba layout (for tests, not conclusions)",
    )
    synth.add_argument("--dir", required=True, help="folder to write into (then GPUPOOL_TRACE_DIR=DIR)")
    synth.add_argument("--nodes", type=int, default=40, help="nodes (default: 40)")
    synth.add_argument("--pods", type=int, default=400, help="pods per pod list (default: 400)")
    synth.add_argument("--seed", type=int, default=0, help="the same seed writes the same files (default: 0)")
    synth.set_defaults(func=_synth)


def _fetch(args: argparse.Namespace) -> int:
    from airflow_gpupool.sim.fetch import fetch, stderr_bar

    paths = fetch(args.dir, base_url=args.base_url, progress=None if args.quiet else stderr_bar())
    folder = paths[0].parent.parent
    print(f"{len(paths)} trace files in {paths[0].parent}; use them with GPUPOOL_TRACE_DIR={folder}")
    return 0


def _synth(args: argparse.Namespace) -> int:
    from airflow_gpupool.sim.synth import synthesize

    try:
        paths = synthesize(args.dir, nodes=args.nodes, pods=args.pods, seed=args.seed)
    except ValueError as e:
        raise ConfigurationError(f"gpupool traces synth: {e}") from None
    print(f"wrote {len(paths)} files in {paths[0].parent}; use them with GPUPOOL_TRACE_DIR={args.dir}")
    return 0
