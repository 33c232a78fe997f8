"""Gang placement: ``count`` members of one shape, all or nothing, across nodes (pure).

Each node's *capacity* is how many members it could take now, one after another
(:func:`~airflow_gpupool.placement.fit.choices` and
:func:`~airflow_gpupool.placement.accounting.allocate` on a copy): members of one shape are
interchangeable, so the order they are packed in does not change how many fit. A plan then
takes the fewest nodes: the ones that take most, the last one chosen by the policy among
those that take the rest (best fit picks the fullest such node). When the gang names
``topology_keys``, a plan inside one domain (nodes sharing every key's value: a zone, a
rack, an NVLink domain) wins over one that spans domains on as many nodes, never over one on
fewer nodes. Among nodes that take as many members, those carrying the request's
``prefer_node_labels`` come first (soft, as for one request: spot for checkpointed training).
Each member's GPUs on its node are the policy's choice, on the working copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from airflow_gpupool.placement.accounting import allocate
from airflow_gpupool.placement.fit import choices
from airflow_gpupool.placement.policy import PlacementPolicy
from airflow_gpupool.placement.pools import UNCONSTRAINED, PoolBindings
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.placement.verdict import Assignment, NoFit, NoFitReason
from airflow_gpupool.resources import GpuRequest

__all__ = ["GangAssignment", "hold_gang_nodes", "members_that_fit", "node_capacity", "place_gang"]


@dataclass(frozen=True, slots=True)
class GangAssignment:
    """Where every member of a gang goes, by member index."""

    members: tuple[Assignment, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        """The distinct nodes of the members, in member order."""
        return tuple(dict.fromkeys(a.node for a in self.members))


def node_capacity(
    node: NodeState, member: GpuRequest, most: int, bindings: PoolBindings = UNCONSTRAINED
) -> tuple[int, NoFitReason | None]:
    """Return how many members of shape ``member`` fit ``node`` now (at most ``most``), and why no more do.

    The reason is None when ``most`` fit.
    """
    taken = 0
    while taken < most:
        options = choices(node, member, bindings)
        if isinstance(options, NoFitReason):
            return taken, options
        node = allocate(node, member, options[0])
        taken += 1
    return taken, None


def members_that_fit(
    snapshot: ClusterSnapshot, member: GpuRequest, most: int, bindings: PoolBindings = UNCONSTRAINED
) -> int:
    """Return how many members of shape ``member`` the whole snapshot takes now, at most ``most``."""
    total = 0
    for node in snapshot.nodes:
        total += node_capacity(node, member, most - total, bindings)[0]
        if total >= most:
            break
    return total


def place_gang(
    snapshot: ClusterSnapshot,
    request: GpuRequest,
    count: int,
    policy: PlacementPolicy,
    bindings: PoolBindings = UNCONSTRAINED,
) -> GangAssignment | NoFit:
    """Place ``count`` members of ``request``'s shape on ``snapshot``, all of them or none.

    :param request: the gang's request (its ``gang`` names the topology keys); each member
        has the request's shape
    :param count: the members to place now (a gang's ``min_members`` when it is admitted)
    :param policy: chooses the last node of a plan and each member's GPUs on its node
    :param bindings: the binding of each node pool: a node whose binding cannot express the
        request takes no member
    :returns: the members' assignments, or a :class:`NoFit` naming what each node takes
        (``takes 2 of the gang's 4 members``) or why it takes none
    """
    if count < 1:
        raise ValueError(f"a gang places at least one member, not {count}")
    member = request.member
    capacity: dict[str, int] = {}
    reasons: list[NoFitReason] = []
    for node in snapshot.nodes:
        taken, reason = node_capacity(node, member, count, bindings)
        if taken:
            capacity[node.name] = taken
        if reason is not None and taken:
            share = 1.0 - taken / count
            reasons.append(NoFitReason(share, node.name, f"takes {taken} of the gang's {count} members"))
        elif reason is not None:
            reasons.append(reason)
    if sum(capacity.values()) < count:
        return NoFit(tuple(sorted(reasons)))
    able = [n for n in snapshot.nodes if n.name in capacity]
    keys = request.gang.topology_keys if request.gang is not None else ()
    plan = _plan(able, capacity, count, keys, policy, member)
    return _assign(able, plan, member, policy)


def _plan(
    nodes: Sequence[NodeState],
    capacity: dict[str, int],
    count: int,
    keys: tuple[str, ...],
    policy: PlacementPolicy,
    member: GpuRequest,
) -> list[tuple[str, int]]:
    """Return ``(node, members)`` pairs on the fewest nodes, inside one topology domain if as few."""
    anywhere = _fewest(nodes, capacity, count, policy, member)
    assert anywhere is not None  # the caller checked that the nodes take them all
    if not keys:
        return anywhere
    best: list[tuple[str, int]] | None = None
    for domain in _domains(nodes, keys):
        plan = _fewest(domain, capacity, count, policy, member)
        if plan is not None and (best is None or len(plan) < len(best)):
            best = plan
    return best if best is not None and len(best) <= len(anywhere) else anywhere


def _domains(nodes: Iterable[NodeState], keys: tuple[str, ...]) -> list[list[NodeState]]:
    """Group the nodes that carry every key by their values (in sorted order of the values)."""
    groups: dict[tuple[str, ...], list[NodeState]] = {}
    for node in nodes:
        labels = dict(node.labels)
        if all(k in labels for k in keys):
            groups.setdefault(tuple(labels[k] for k in keys), []).append(node)
    return [groups[values] for values in sorted(groups)]


def _fewest(
    nodes: Sequence[NodeState],
    capacity: dict[str, int],
    count: int,
    policy: PlacementPolicy,
    member: GpuRequest,
) -> list[tuple[str, int]] | None:
    """Return the plan on the fewest of ``nodes``, or None when they cannot take ``count`` members."""
    # Among nodes that take as many, those carrying the preferred labels first (a preference orders
    # what the plan finds equally good, as for one request); stable: snapshot order among equals.
    want = set(member.prefer_node_labels)
    ordered = sorted(nodes, key=lambda n: (-capacity[n.name], not want.issubset(n.labels)))
    total, used = 0, 0
    while total < count:
        if used == len(ordered):
            return None
        total += capacity[ordered[used].name]
        used += 1
    head = ordered[: used - 1]
    rest = count - sum(capacity[n.name] for n in head)
    # The last node takes what the others leave: the policy picks it among those that can.
    candidates = tuple(n for n in ordered[used - 1 :] if capacity[n.name] >= rest)
    verdict = policy.place(ClusterSnapshot(candidates), member)
    last = verdict.node if isinstance(verdict, Assignment) else candidates[0].name
    return [(n.name, capacity[n.name]) for n in head] + [(last, rest)]


def _assign(
    nodes: Sequence[NodeState], plan: list[tuple[str, int]], member: GpuRequest, policy: PlacementPolicy
) -> GangAssignment | NoFit:
    """Place each planned member on its node with the policy, on a working copy."""
    current = {n.name: n for n in nodes}
    members: list[Assignment] = []
    for name, many in plan:
        for _ in range(many):
            node = current[name]
            verdict = policy.place(ClusterSnapshot((node,)), member)
            if not isinstance(verdict, Assignment):  # the policy disagrees with fit.choices
                return NoFit(verdict.reasons)
            members.append(verdict)
            current[name] = allocate(node, member, verdict)
    return GangAssignment(tuple(members))


def hold_gang_nodes(
    current: Sequence[NodeState],
    empty: Sequence[NodeState],
    request: GpuRequest,
    held: frozenset[str],
    bindings: PoolBindings = UNCONSTRAINED,
) -> tuple[str, ...] | None:
    """Return the nodes to hold for a starving gang: enough to take its minimum once emptied, the closest first.

    The gang's counterpart of :func:`~airflow_gpupool.placement.queue.hold_node`: a node
    comes first when it lacks fewest members now of what it could take emptied, then when
    it takes most. None when the nodes not held cannot take the minimum even emptied.

    :param current: the nodes as they are
    :param empty: the same nodes, in the same order, with nothing granted
    """
    assert request.gang is not None
    count, member = request.gang.min_members, request.member
    ranked: list[tuple[int, int, int, str]] = []
    for position, (node, blank) in enumerate(zip(current, empty, strict=True)):
        if node.name in held:
            continue
        could = node_capacity(blank, member, count, bindings)[0]
        if could:
            now = node_capacity(node, member, could, bindings)[0]
            ranked.append((could - now, -could, position, node.name))
    ranked.sort()
    chosen: list[str] = []
    total = 0
    for _, minus_could, _, name in ranked:
        chosen.append(name)
        total -= minus_could
        if total >= count:
            return tuple(chosen)
    return None
