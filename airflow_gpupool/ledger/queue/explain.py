"""Why a waiting reservation waits, as users read it (``Ledger.explain``, a timeout's message).

It names the reservation's place in the queue and, when nothing fits, the nodes closest to
fitting with the first dimension that does not fit on each (the order of
:mod:`airflow_gpupool.placement.fit`), the nodes the queue holds for a starving request, and
the node pools whose binding could take the request when bindings rule some out. When pods the
ledger did not grant (its external holds) stand between the request and a node, that is where
their GPUs plus the node's free ones would be enough, it names them by node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Row

from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.db.records import waiting_ahead
from airflow_gpupool.ledger.queue.ahead import STEPPED_BACK_FOR
from airflow_gpupool.ledger.store.cache import CapacityCache
from airflow_gpupool.ledger.store.scalable import no_empty_node_fits, pool_that_fits, scalable_shapes
from airflow_gpupool.ledger.store.transactions import LedgerStore, Tx
from airflow_gpupool.placement.explain import explain, pools_note
from airflow_gpupool.placement.gang import hold_gang_nodes, members_that_fit, place_gang
from airflow_gpupool.placement.policy import PlacementPolicy
from airflow_gpupool.placement.pools import PoolBindings
from airflow_gpupool.placement.queue import hold_node
from airflow_gpupool.placement.snapshot import ClusterSnapshot
from airflow_gpupool.placement.verdict import NoFit
from airflow_gpupool.resources import MILLI_PER_GPU, GpuRequest

__all__ = ["WaitContext", "autoscale_note", "blocked_message", "external_note", "held_nodes"]


class WaitContext:
    """What an explanation reads besides the transaction: placement, bindings, the queue bound.

    :param store: the ledger's store (requests by row)
    :param cache: a loaded capacity copy (for the empty inventory)
    """

    def __init__(
        self,
        store: LedgerStore,
        cache: CapacityCache,
        policy: PlacementPolicy,
        bindings: PoolBindings,
        max_overtakes: int,
    ) -> None:
        self.store = store
        self.cache = cache
        self.policy = policy
        self.bindings = bindings
        self.max_overtakes = max_overtakes


def held_nodes(ctx: WaitContext, tx: Tx, row: Row[Any]) -> dict[str, str]:
    """Return the node the queue holds ahead of ``row``, as ``{node: starving request id}``.

    The queue holds one node for the first request (in service order) whose overtake
    budget is spent; it applies to the requests behind that one.
    """
    for waiting in tx.conn.execute(sql.WAITING):
        if waiting.id == row.id:
            return {}
        if waiting.overtakes < ctx.max_overtakes:
            continue
        current = list(tx.nodes.values())
        empty = ctx.cache.empty_snapshot(current).nodes
        request = ctx.store.request_of(waiting)
        if request.gang is not None:
            nodes = hold_gang_nodes(current, empty, request, frozenset(), ctx.bindings) or ()
            return dict.fromkeys(nodes, waiting.id)
        node = hold_node(current, empty, request, frozenset(), ctx.bindings)
        return {node: waiting.id} if node is not None else {}
    return {}


def _placeable(
    ctx: WaitContext, snapshot: ClusterSnapshot, request: GpuRequest, held: Mapping[str, str]
) -> Any:
    bindings = ctx.bindings
    nodes = tuple(n for n in snapshot.nodes if n.name not in held and bindings.allows(n.node_pool, request))
    return ctx.policy.place(ClusterSnapshot(nodes), request)


def _gang_blocked(
    ctx: WaitContext, snapshot: ClusterSnapshot, request: GpuRequest, held: Mapping[str, str]
) -> str | None:
    """Say how many of a waiting gang's members fit now and what blocks the rest; None when it fits."""
    assert request.gang is not None
    bindings, count = ctx.bindings, request.gang.min_members
    nodes = ClusterSnapshot(
        tuple(n for n in snapshot.nodes if n.name not in held and bindings.allows(n.node_pool, request))
    )
    verdict = place_gang(nodes, request, count, ctx.policy, bindings)
    if not isinstance(verdict, NoFit):
        return None
    fit = members_that_fit(nodes, request.member, count, bindings)
    closest = "; ".join(verdict.summary(3)) or "the inventory is empty"
    blocked = f"{fit} of the {count} members of {request.describe()} fit now; closest: {closest}"
    if held:
        blocked += f"; held for starving requests: {', '.join(sorted(held))}"
    return blocked


def external_note(
    ctx: WaitContext, tx: Tx, snapshot: ClusterSnapshot, request: GpuRequest, held: Mapping[str, str]
) -> str | None:
    """Name the external holds on each node where they stand between ``request`` and a fit; None: nowhere.

    A node counts when the request may go there (its pool's binding, not held for a starving
    request) and its free GPU compute plus the external holds' would be enough.
    """
    holds: dict[str, dict[str, int]] = {}
    for row in tx.conn.execute(sql.EXTERNAL_HOLDS):
        hold = ctx.store.reservation(tx.conn, row)
        if hold.grant is not None:
            on_node = holds.setdefault(hold.grant.node, {})
            on_node[hold.holder] = on_node.get(hold.holder, 0) + hold.request.total_gpu_milli
    notes = []
    for node in snapshot.nodes:
        on_node = holds.get(node.name, {})
        external = sum(on_node.values())
        if not external or node.name in held or not ctx.bindings.allows(node.node_pool, request):
            continue
        if node.gpu_free_milli + external >= request.total_gpu_milli:
            pods = ", ".join(sorted(on_node))
            notes.append(
                f"{node.name}: {external / MILLI_PER_GPU:g} GPUs held by pods the ledger did not grant ({pods})"
            )
    return "; ".join(notes) or None


def autoscale_note(ctx: WaitContext, tx: Tx, request: GpuRequest) -> str | None:
    """Name the scalable pool a request waits for: no node of the inventory could take it, even empty; None: one could.

    See :mod:`~airflow_gpupool.ledger.store.scalable`.
    """
    empty = ctx.cache.empty_snapshot(tx.nodes.values())
    if no_empty_node_fits(empty, request, ctx.policy, ctx.bindings) is None:
        return None
    pool, _ = pool_that_fits(scalable_shapes(tx.conn), request, ctx.bindings)
    if pool is None:
        return None
    return (
        f"it waits for the autoscaler to add a node of scalable pool {pool} "
        "(no node of the inventory could take it, even empty)"
    )


def blocked_message(
    ctx: WaitContext, tx: Tx, row: Row[Any], request: GpuRequest, quota_refusal: str | None = None
) -> str:
    """Say why the waiting reservation ``row`` waits: its team's quota, its place in the queue, or the closest nodes.

    :param quota_refusal: why its team's quota refuses it on every node (None: it does not)
    """
    ahead = waiting_ahead(tx.conn, row)
    waited = f"waited {tx.now - row.created_at:.0f}s with {ahead} request(s) ahead; "
    early = row.not_before is not None and row.not_before > tx.now
    if early:
        # Queued ahead of its upstream's end: it keeps its place, and then the rest applies.
        of = f" of {row.ahead_of}" if row.ahead_of else ""
        if row.not_before - tx.now > STEPPED_BACK_FOR / 2:
            waited += f"queued ahead{of}, stepped back (its upstream ran late): not granted until its step claims it; "
        else:
            waited += (
                f"queued ahead{of}: not granted for another {row.not_before - tx.now:.0f}s (its not_before); "
            )
    if quota_refusal:
        return f"{waited}{quota_refusal}"
    snapshot = tx.snapshot()
    held = held_nodes(ctx, tx, row)
    if request.gang is not None:
        gang = _gang_blocked(ctx, snapshot, request, held)
        blocked = gang or f"its members fit now but {ahead} earlier request(s) hold the queue"
        note = autoscale_note(ctx, tx, request) if gang else None
        blocked += f"; {note}" if note else ""
        return f"{waited}{blocked}"
    verdict = _placeable(ctx, snapshot, request, held)
    if isinstance(verdict, NoFit):
        reasons = explain(snapshot, request, ctx.bindings, held)
        closest = "; ".join(reasons.summary(3)) or "the inventory is empty"
        blocked = f"no node fits {request.describe()}; closest: {closest}"
        for note in (
            autoscale_note(ctx, tx, request),
            external_note(ctx, tx, snapshot, request, held),
            pools_note(snapshot.nodes, request, ctx.bindings),
        ):
            if note:
                blocked += f"; {note}"
    elif early and not ahead:
        blocked = f"it fits {verdict.node} now"
    else:
        blocked = f"it fits {verdict.node} now but {ahead} earlier request(s) hold the queue"
    return f"{waited}{blocked}"
