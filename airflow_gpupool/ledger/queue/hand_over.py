"""What a release needs to hand an emptied node to the queue's first request (PostgreSQL).

After a pass, the first waiting request in service order is granted as soon as a node it fits
is freed: only that node changed, and every other node fits no waiting request (:mod:`~airflow_gpupool.ledger.store.gate`).
When a release empties a node, a pass would grant it there if it fits the node empty. The pass
therefore marks the nodes it fits empty (``head_fits``) and records which request shape that is
for (``queue_head_shape``, a hash of its stored request) and at which inventory generation
(``queue_head_generation``); ``gpupool_give_back`` (:mod:`~airflow_gpupool.ledger.postgres.functions`) then grants it in the
release's own transaction, under the shared lock, where the rest of a pass's rule holds (see
there). Only whole-GPU requests with no model or GPU-memory constraint are marked: on an empty
node the function takes the first GPUs by index, as placement would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import text

from airflow_gpupool.ledger.store.transactions import Tx
from airflow_gpupool.placement.fit import choices
from airflow_gpupool.placement.pools import PoolBindings
from airflow_gpupool.placement.queue import QueueEntry
from airflow_gpupool.placement.snapshot import NodeState
from airflow_gpupool.placement.verdict import NoFitReason
from airflow_gpupool.resources import GpuRequest

__all__ = ["NO_HEAD", "publish_head"]

#: ``queue_head_generation`` when no request may be handed a node.
NO_HEAD = -1

_PUBLISH = text(
    """
    WITH marked AS (
        UPDATE gpupool_nodes SET head_fits = (name = ANY (:fits))
        WHERE head_fits IS DISTINCT FROM (name = ANY (:fits))
        RETURNING 1
    )
    INSERT INTO gpupool_meta (key, value) VALUES
        ('queue_head_shape', coalesce((SELECT hashtext(request) FROM gpupool_reservations WHERE id = :head), 0)),
        ('queue_head_generation', :generation)
    ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value
    """
)


def may_hand_over(request: GpuRequest) -> bool:
    """Whether the concurrent path may grant ``request`` on an emptied node (first GPUs by index)."""
    return (
        request.gpus > 0
        and request.gpu_milli is None
        and request.mig_profile is None
        and request.gang is None
        and not request.gpu_models
        and request.gpu_memory_mib is None
    )


def publish_head(
    tx: Tx,
    head: QueueEntry | None,
    current: Sequence[NodeState],
    empty: Iterable[NodeState],
    bindings: PoolBindings,
    generation: int,
) -> None:
    """Mark the nodes ``head`` (the first request left waiting) fits empty, or none."""
    fits: list[str] = []
    if head is not None and may_hand_over(head.request) and not tx.inventory_changed:
        fits = [
            node.name
            for node, blank in zip(current, empty, strict=True)
            if not isinstance(choices(blank, head.request, bindings), NoFitReason)
        ]
    params = {
        "fits": fits,
        "head": head.request_id if head is not None else None,
        "generation": generation if fits else NO_HEAD,
    }
    tx.conn.execute(_PUBLISH, params)
