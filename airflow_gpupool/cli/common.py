"""What the ``gpupool`` command modules share: common options, the ledger, output, optional extras."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_gpupool.argtypes import bind_address, non_empty, port
from airflow_gpupool.exceptions import GpuPoolError

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger

#: Lists every pod of the cluster as JSON.
PodLister = Callable[[], list[dict[str, Any]]]

__all__ = [
    "PodLister",
    "cluster_args",
    "health_args",
    "kubernetes_api_errors",
    "ledger_url",
    "logger_level",
    "open_ledger",
    "print_json",
    "require_extra",
    "table",
    "url_arg",
]


URL_HELP = (
    "ledger URL (default: GPUPOOL_LEDGER_URL, the gpupool_default connection, [gpupool] ledger_url, "
    "or SQLite under AIRFLOW_HOME)"
)


def url_arg(parser: argparse.ArgumentParser) -> None:
    """Add ``--url``, the ledger URL.

    :param parser: a command's parser
    """
    parser.add_argument("--url", type=non_empty, help=URL_HELP)


def ledger_url(args: argparse.Namespace) -> str:
    """Return the ledger URL of a command, found as the operator finds it.

    :param args: parsed arguments (``--url``)
    """
    from airflow_gpupool.hooks.gpupool import resolve_ledger_url

    return resolve_ledger_url(getattr(args, "url", None))


def _require_sqlite_file(url: str) -> None:
    # SQLite creates a missing file on connect: a read would leave an empty "ledger" behind.
    from sqlalchemy.engine import make_url

    from airflow_gpupool.exceptions import LedgerSchemaError
    from airflow_gpupool.redact import redact_url

    try:
        parsed = make_url(url)
    except Exception:  # the ledger's own URL check says what is wrong
        return
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:") or database.startswith("file:"):
        return
    if not Path(database).is_file():
        shown = redact_url(url)
        raise LedgerSchemaError(
            f"no GPU ledger at {shown}: create it with `gpupool ledger init --url {shown}`"
        )


def health_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--health-port`` and ``--health-bind``: a long-running loop's ``/healthz`` and ``/readyz``.

    :param parser: a command's parser
    """
    parser.add_argument(
        "--health-port",
        metavar="PORT",
        type=port,
        help="serve /healthz (the loop made a pass lately) and /readyz (a first pass ended) on this "
        "port, for the kubelet's probes (default: no health server)",
    )
    parser.add_argument(
        "--health-bind",
        metavar="ADDR",
        type=bind_address,
        default="0.0.0.0",
        help="address the health server listens on (default %(default)s: the kubelet probes the pod's IP)",
    )


def cluster_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--url``, ``--kubeconfig``, ``--context`` and ``--json``: a command that reads a cluster.

    :param parser: a command's parser
    """
    url_arg(parser)
    parser.add_argument(
        "--kubeconfig", metavar="F", help="kubeconfig file (default: KUBECONFIG, ~/.kube/config, in-cluster)"
    )
    parser.add_argument("--context", metavar="C", help="kubeconfig context (default: the current one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def open_ledger(args: argparse.Namespace, create: bool = False, *, must_exist: bool = True) -> Ledger:
    """Open the ledger that ``--url`` (or the configuration) names; never create one by reading.

    :param args: parsed arguments
    :param create: create or migrate its schema first
    :param must_exist: without ``create``, fail (:class:`LedgerSchemaError`) when a SQLite ledger
        file does not exist, instead of leaving an empty file behind
    """
    from airflow_gpupool.ledger import Ledger

    url = ledger_url(args)
    if create:
        return Ledger.create(url)
    if must_exist:
        _require_sqlite_file(url)
    return Ledger(url)


@contextmanager
def logger_level(name: str, level: int | str) -> Iterator[None]:
    """Set a logger's level for a command only: run in-process (tests, a notebook), it must not leak.

    :param name: the logger, such as ``airflow_gpupool``
    :param level: its level while the command runs
    """
    logger = logging.getLogger(name)
    previous = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)


def print_json(data: Any) -> None:
    """Print one indented JSON document, keys sorted."""
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Return rows as left-aligned text columns under their headers."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def kubernetes_api_errors() -> tuple[type[BaseException], ...]:
    """Return the errors a Kubernetes API call raises when the cluster refuses or cannot be reached."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    return ApiException, HTTPError


def require_extra(package: str, extra: str, command: str) -> None:
    """Import an optional package, or fail with the ``pip install`` line that brings it.

    Only the package's own absence is translated: an import error from inside it (a real bug, a
    broken install) propagates as it is.

    :param package: the top-level package the command needs, such as ``kmock``
    :param extra: the ``airflow-gpupool`` extra that installs it, such as ``testing``
    :param command: the command, for the message (``gpupool emulator``)
    :raises GpuPoolError: the package is not installed (``main`` exits 2)
    """
    try:
        importlib.import_module(package)
    except ModuleNotFoundError as e:
        if e.name != package:
            raise
        raise GpuPoolError(
            f"{command} needs {package}, which the {extra!r} extra installs: "
            f"pip install 'airflow-gpupool[{extra}]'"
        ) from e
