"""A node card's books line: what the ledger holds on the node beside what the cluster runs there.

The page reads the ledger only (the Airflow API server needs no Kubernetes access). The ledger's
side (granted, external, free GPUs) comes from its snapshot; the cluster's side (the GPUs the
node's live pods hold, and the drift between the two) is what the controller computed from its pod
watch at its last drift pass and stored (:class:`~airflow_gpupool.ledger.LedgerDriftRecords`). A
node the controller has not judged yet shows the ledger's side alone.
"""

from __future__ import annotations

import time
from html import escape
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_gpupool.ledger import DriftRecord, NodeDrift

__all__ = ["BOOKS_TITLE", "CLUSTER_TITLE", "books_html", "cluster_html", "drift_json"]

BOOKS_TITLE = (
    "What the ledger holds on this node. Whether the pods the cluster runs agree: "
    "gpupool status --kubeconfig, and the gpupool_ledger_drift_gpus gauge"
)
CLUSTER_TITLE = (
    "What the node's live pods hold, as the controller's pod watch last saw them, and the drift: "
    "the GPUs by which the ledger's holders and the pods disagree"
)


def books_html(row: NodeDrift | None, cluster: DriftRecord | None = None) -> str:
    """Return the node's books line (nothing for a node without GPUs).

    :param row: the node's :func:`~airflow_gpupool.ledger.ledger_drift` row (ledger side only)
    :param cluster: the controller's stored drift of the node (None: not computed yet)
    """
    if row is None or not row.capacity:
        return ""
    return (
        f'<div class="meta books" title="{BOOKS_TITLE}">ledger: {row.granted:g} granted · '
        f"{row.external:g} external · {row.free:g} free GPUs{cluster_html(cluster)}</div>"
    )


def cluster_html(cluster: DriftRecord | None, now: float | None = None) -> str:
    """Return the cluster's side of a books line: the pods' GPUs and the drift (empty: not computed).

    :param cluster: the controller's stored drift of the node
    :param now: the clock for "for N s" (default: this machine's)
    """
    if cluster is None:
        return ""
    drift = ""
    if cluster.drift:
        lasting = f" for {max(0.0, (now or time.time()) - cluster.since):.0f}s" if cluster.since else ""
        what = escape("; ".join(cluster.mismatched))
        drift = f' · <span class="badge drift" title="{what}">drift {cluster.drift:g} GPUs{lasting}</span>'
    return (
        f' <span class="cluster" title="{CLUSTER_TITLE}">| cluster: {cluster.running:g} running'
        f"{drift or ' · no drift'}</span>"
    )


def drift_json(records: dict[str, DriftRecord]) -> dict[str, dict[str, Any]]:
    """Return the stored drift by node as primitives (the JSON API).

    :param records: :meth:`~airflow_gpupool.ledger.LedgerDriftRecords.get`
    """
    return {
        node: {
            "running_gpus": r.running,
            "drift_gpus": r.drift,
            "mismatched": list(r.mismatched),
            "drifting_since": r.since,
            "computed_at": r.computed_at,
        }
        for node, r in records.items()
    }
