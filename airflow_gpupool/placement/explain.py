"""Why a request does not fit: one reason per node, closest first (pure).

Each node's reason names the first dimension that does not fit, in the order documented
in :mod:`~airflow_gpupool.placement.fit`; a node that would fit but is held for a starving
request says so (the last dimension). The ledger's ``explain`` and a timed-out request's
message are built from this.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from airflow_gpupool.placement.fit import choices
from airflow_gpupool.placement.pools import KIND_WORDS, UNCONSTRAINED, PoolBindings
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.placement.verdict import NoFit, NoFitReason
from airflow_gpupool.resources import GpuRequest

__all__ = ["explain", "pools_note"]


def explain(
    snapshot: ClusterSnapshot,
    request: GpuRequest,
    bindings: PoolBindings = UNCONSTRAINED,
    held: Mapping[str, str] | None = None,
) -> NoFit:
    """Return a NoFit whose reasons say why each node rejects ``request``, closest first.

    :param snapshot: the cluster now
    :param request: the request that waits
    :param bindings: the binding of each node pool
    :param held: node name -> the starving request the queue holds it for; such a node
        rejects ``request`` even when it would fit
    """
    held = held or {}
    reasons = []
    for node in snapshot.nodes:
        verdict = choices(node, request, bindings)
        if isinstance(verdict, NoFitReason):
            reasons.append(verdict)
        elif node.name in held:
            reasons.append(
                NoFitReason(
                    0.0, node.name, f"held for starving request {held[node.name]} (it fits once released)"
                )
            )
    return NoFit(tuple(sorted(reasons)))


def pools_note(nodes: Iterable[NodeState], request: GpuRequest, bindings: PoolBindings) -> str:
    """Name the node pools whose binding can express ``request``, when bindings rule some out.

    :return: ``""`` when no pool is ruled out; else which pools could take it, or that none can
    """
    pools = {n.node_pool for n in nodes}
    able = bindings.able_pools(pools, request)
    if len(able) == len(pools):
        return ""
    what = KIND_WORDS[request.kind]
    if not able:
        return f"no node pool's binding can express {what}: set node_pool_bindings for a pool that should"
    return f"only pools {', '.join(able)} have a binding that can express {what}"
