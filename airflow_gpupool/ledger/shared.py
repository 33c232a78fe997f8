"""One ledger per process and URL: the hooks and triggers of a process share its connections.

Every hook used to build its own :class:`~airflow_gpupool.ledger.Ledger`, engine and
capacity copy, so a triggerer with a thousand deferred tasks held a thousand PostgreSQL
connections (PostgreSQL allows 100 by default). Here each process keeps one ledger per
(URL, placement policy), its pools bounded by ``[gpupool] max_connections_per_process``;
users count in and out, and the last one out closes its connections (the ledger object
stays, ready to reconnect). A forked child starts its own ledgers: connections are never
shared across processes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from airflow_gpupool import settings
from airflow_gpupool.ledger.ledger import Ledger

__all__ = ["close_shared", "release_shared", "shared_ledger"]


@dataclass
class _Shared:
    ledger: Ledger
    users: int = 0


_lock = threading.Lock()
_ledgers: dict[tuple[object, ...], _Shared] = {}


def shared_ledger(
    url: str | None = None,
    policy: str | None = None,
    *,
    binding: str | None = None,
    node_pool_bindings: Mapping[str, str] | None = None,
) -> Ledger:
    """Return this process's ledger for ``url``, ``policy`` and bindings, opening it on first use.

    Each call counts a user: give it back with :func:`release_shared`.

    :param url: the ledger URL (default :func:`airflow_gpupool.settings.ledger_url`)
    :param policy: the placement policy name (default ``[gpupool] placement_policy``)
    :param binding: the binding of node pools not in ``node_pool_bindings`` (see :class:`Ledger`)
    :param node_pool_bindings: the binding of each named node pool
    """
    pools = tuple(sorted((node_pool_bindings or {}).items()))
    key = (os.getpid(), settings.ledger_url(url), policy or settings.placement_policy(), binding, pools)
    with _lock:
        shared = _ledgers.get(key)
        if shared is None:
            ledger = Ledger(str(key[1]), policy=policy, binding=binding, node_pool_bindings=dict(pools))
            shared = _ledgers[key] = _Shared(ledger)
        shared.users += 1
        return shared.ledger


def release_shared(ledger: Ledger) -> None:
    """Count one user of ``ledger`` out; the last one closes its connections."""
    with _lock:
        for shared in _ledgers.values():
            if shared.ledger is ledger and shared.users > 0:
                shared.users -= 1
                if shared.users == 0:
                    ledger.close()
                return


def close_shared() -> None:
    """Close and forget every shared ledger of this process (tests, shutdown)."""
    with _lock:
        ledgers = [s.ledger for s in _ledgers.values()]
        _ledgers.clear()
    for ledger in ledgers:
        ledger.close()
