"""Scalable pools as the ledger keeps them: the empty node an autoscaler can add, by pool.

The controller knows the pools (``[gpupool] scalable_node_pools``, Karpenter NodePools, Cluster
Autoscaler node groups) and turns each into the node GPU Feature Discovery and the device plugin
would show, as placement sees it with everything free. It stores them here
(:meth:`LedgerScalablePools.replace`, one write) because a reserve runs in another process (the
worker, the triggerer) that has neither the configuration's discovery nor cluster access: there, a
request that fits no node of the inventory, even empty, waits when one of these nodes would take
it (the autoscaler is asked for it) and is refused only when none would.

A pool stays stored until the controller's next replace leaves it out; a request that waits for
a pool that then goes waits until its timeout, as any request whose nodes went.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, insert, select

from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.placement.fit import choices
from airflow_gpupool.placement.gang import node_capacity, place_gang
from airflow_gpupool.placement.pools import UNCONSTRAINED, PoolBindings
from airflow_gpupool.placement.snapshot import ClusterSnapshot, GpuState, NodeState
from airflow_gpupool.placement.verdict import NoFit, NoFitReason
from airflow_gpupool.resources import MILLI_PER_GPU, GpuKind, GpuRequest

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from airflow_gpupool.ledger.store.access import LedgerAccess
    from airflow_gpupool.ledger.store.transactions import Tx
    from airflow_gpupool.placement.policy import PlacementPolicy

__all__ = [
    "LedgerScalablePools",
    "ScalableShape",
    "node_from_dict",
    "node_to_dict",
    "no_empty_node_fits",
    "pool_that_fits",
    "scalable_shapes",
]


@dataclass(frozen=True)
class ScalableShape:
    """One scalable pool as the ledger judges it: its name, where it was found, its empty node.

    :param name: the pool's name
    :param source: ``config``, ``karpenter`` or ``cluster-api``
    :param node: an empty node of the pool as placement sees it (everything free)
    """

    name: str
    source: str
    node: NodeState


def node_to_dict(node: NodeState) -> dict[str, Any]:
    """Return an empty node's shape as primitives (what an empty node needs: nothing allocated).

    :param node: the node, everything free
    """
    return {
        "name": node.name,
        "cpu_milli": node.cpu_milli,
        "memory_mib": node.memory_mib,
        "labels": [list(pair) for pair in node.labels],
        "node_pool": node.node_pool,
        "gpus": [
            {
                "index": g.index,
                "model": g.model,
                "memory_mib": g.memory_mib,
                "free_milli": g.free_milli,
                "mig_free": [list(pair) for pair in g.mig_free],
                "partitioned": g.partitioned,
            }
            for g in node.gpus
        ],
    }


def node_from_dict(data: dict[str, Any]) -> NodeState:
    """Return the empty node :func:`node_to_dict` wrote.

    :param data: its primitives
    """
    gpus = tuple(
        GpuState(
            index=int(g["index"]),
            model=str(g["model"]),
            memory_mib=int(g["memory_mib"]),
            free_milli=int(g.get("free_milli", 0 if g["partitioned"] else MILLI_PER_GPU)),
            mig_free=tuple((str(s), str(p)) for s, p in g["mig_free"]),
            partitioned=bool(g["partitioned"]),
        )
        for g in data["gpus"]
    )
    return NodeState(
        str(data["name"]),
        int(data["cpu_milli"]),
        int(data["memory_mib"]),
        gpus,
        labels=tuple((str(k), str(v)) for k, v in data["labels"]),
        node_pool=str(data["node_pool"]),
    )


def scalable_shapes(conn: Connection) -> list[ScalableShape]:
    """Return the stored scalable pools, by name.

    :param conn: a connection of any transaction
    """
    t = schema.scalable_pools
    rows = conn.execute(select(t.c.name, t.c.source, t.c.node).order_by(t.c.name))
    return [ScalableShape(r.name, r.source, node_from_dict(json.loads(r.node))) for r in rows]


def no_empty_node_fits(
    empty: ClusterSnapshot, request: GpuRequest, policy: PlacementPolicy, bindings: PoolBindings
) -> list[NoFitReason] | None:
    """Return why ``request`` fits no node of ``empty`` (the inventory with nothing granted), or None when one takes it.

    :param empty: the inventory emptied (``CapacityCache.empty_snapshot``)
    :param request: the request (a gang: its ``min_members`` together)
    :param policy: places a gang's last member
    :param bindings: the slice binding of each node pool
    """
    if request.gang is not None:
        gang = place_gang(empty, request, request.gang.min_members, policy, bindings)
        return list(gang.reasons) if isinstance(gang, NoFit) else None
    reasons = []
    for node in empty.nodes:
        verdict = choices(node, request, bindings)
        if not isinstance(verdict, NoFitReason):
            return None
        reasons.append(verdict)
    return reasons


def pool_that_fits(
    shapes: Sequence[ScalableShape], request: GpuRequest, bindings: PoolBindings = UNCONSTRAINED
) -> tuple[str | None, list[NoFitReason]]:
    """Return the first pool whose empty node takes ``request`` (a gang: one member), and why the others do not.

    A gang waits for a pool when one member fits its empty node: the autoscaler adds as many
    nodes as the gang needs (:func:`~airflow_gpupool.placement.gang.node_capacity`, as the
    controller sizes the scale-up). A CPU-only request never waits for a GPU pool.

    :param shapes: the stored pools, in order
    :param request: the request
    :param bindings: the slice binding of each node pool
    """
    reasons: list[NoFitReason] = []
    if request.kind is GpuKind.NONE:
        return None, reasons
    for shape in shapes:
        if request.gang is not None:
            fit, why = node_capacity(shape.node, request, 1, bindings)
            if fit:
                return shape.name, reasons
            assert why is not None
            reasons.append(why)
            continue
        verdict = choices(shape.node, request, bindings)
        if not isinstance(verdict, NoFitReason):
            return shape.name, reasons
        reasons.append(verdict)
    return None, reasons


class LedgerScalablePools:
    """Store the scalable pools (the controller) and read them back (anyone).

    :param ledger: the ledger
    """

    def __init__(self, ledger: LedgerAccess) -> None:
        self.ledger = ledger

    def replace(self, shapes: Sequence[ScalableShape]) -> bool:
        """Replace every stored pool with ``shapes`` (one write: a reserve sees all or none).

        Nothing is written when the stored pools are the same (the controller calls it each pass).

        :param shapes: the pools, names unique
        :returns: whether anything changed
        :raises ConfigurationError: two pools of one name
        """
        names = [s.name for s in shapes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigurationError(
                f"scalable pools {twice} are declared twice (configuration and discovery): rename one"
            )
        if self.get() == sorted(shapes, key=lambda s: s.name):
            return False

        def run(tx: Tx) -> None:
            tx.conn.execute(delete(schema.scalable_pools))
            if shapes:
                rows = [
                    {
                        "name": s.name,
                        "source": s.source,
                        "node": json.dumps(node_to_dict(s.node), sort_keys=True),
                        "updated_at": tx.now,
                    }
                    for s in shapes
                ]
                tx.conn.execute(insert(schema.scalable_pools), rows)

        self.ledger.write(run)
        return True

    def get(self) -> list[ScalableShape]:
        """Return the stored pools, by name."""
        return self.ledger.read(scalable_shapes)
