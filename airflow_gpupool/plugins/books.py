"""A node card's books line: what the ledger holds on the node (granted, external, free GPUs).

The page reads the ledger only (the Airflow API server needs no Kubernetes access), so it shows
the ledger's side of the drift; whether the cluster's pods agree is ``gpupool status
--kubeconfig F`` and the ``gpupool_ledger_drift_gpus`` gauge of ``gpupool metrics serve --drift``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_gpupool.ledger import NodeDrift

__all__ = ["BOOKS_TITLE", "books_html"]

BOOKS_TITLE = (
    "What the ledger holds on this node. Whether the pods the cluster runs agree: "
    "gpupool status --kubeconfig, and the gpupool_ledger_drift_gpus gauge"
)


def books_html(row: NodeDrift | None) -> str:
    """Return the node's books line (nothing for a node without GPUs).

    :param row: the node's :func:`~airflow_gpupool.ledger.ledger_drift` row (ledger side only)
    """
    if row is None or not row.capacity:
        return ""
    return (
        f'<div class="meta books" title="{BOOKS_TITLE}">ledger: {row.granted:g} granted · '
        f"{row.external:g} external · {row.free:g} free GPUs</div>"
    )
