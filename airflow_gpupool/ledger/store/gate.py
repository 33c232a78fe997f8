"""The queue gate: when a grant or a release may skip the queue although requests wait.

A pass over the queue (:meth:`~airflow_gpupool.ledger.queue.cycle.WriteCycle.serve`) leaves every
request it did not grant *blocked*: it fits no node outside the held ones. Until the next
pass, a grant only takes capacity, so every waiting request stays blocked; and a release
leaves them blocked if the node it frees still lacks what the smallest waiting request needs.
The pass therefore publishes, in ``gpupool_meta``, what a later writer needs to know to leave
the queue alone:

- ``open``: the pass found nothing that needs it every time (no request stopped the queue
  without a node to hold, no gang, MIG profile or CPU-only request waits, no preemption is
  possible, no quota is stored);
- ``min_gpus``: the fewest whole GPUs a waiting request asks for; a release that leaves its node
  with fewer fully free GPUs cannot make a whole-GPU request fit;
- ``min_milli``: the smallest fraction of a GPU a waiting request asks for; a release that leaves
  no GPU of its node with that much free cannot make a fractional request fit (memory, CPU and
  models only make fitting harder, so the check errs towards serving the queue);
- ``unspent_priority``: the highest priority of a waiting request whose overtake budget is not
  spent. A grant of a request at or below it overtakes that request: the grant counts one
  overtake of each waiting request at or above its priority whose budget is not spent, as a
  pass would (``bound`` overtakes spend a budget). One above it overtakes only spent requests,
  whose count no longer moves. A grant that spends a budget lowers it to the highest priority
  still unspent (a request queued without a pass raises it), so once every budget is spent,
  grants stop counting;
- ``hold_priority`` and ``hold_seq``: the service order of the request the pass held a node for.
  A request that spends its budget behind it changes nothing a pass decides (a pass holds one
  node, for the first spent request in service order), so the gate stays open; one that spends
  it ahead of the held one, or with no hold, closes the gate, and the next writer's pass holds a
  node for it.

Held nodes are marked on their row (``held_for``): a grant on them goes through the queue. A
grant elsewhere only moves other nodes further from fitting the held-for request, and a release
on the held node only brings it closer, so the hold stays the node a pass would choose. (A
release elsewhere may bring another node closer than the held one; the hold stays where it is
until the next pass, still a node that drains for its request.)

A release that empties a node the first waiting request fits grants it there without a pass on
PostgreSQL (:mod:`~airflow_gpupool.ledger.queue.hand_over`), moving the hold to the next request of its
shape; the gate's shape keys then err towards serving (a request granted may have been the
smallest), the rest stays exact. Writers that change the queue or capacity in other ways run a
pass (which publishes the gate anew) or close it; the concurrent path on PostgreSQL (:mod:`~airflow_gpupool.ledger.postgres.functions`)
and the serialized grant and release (:mod:`~airflow_gpupool.ledger.grants.serialized`) apply the same test.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from airflow_gpupool.placement.snapshot import NodeState
from airflow_gpupool.resources import MILLI_PER_GPU, GpuRequest

__all__ = ["ALL_SPENT", "GATE_KEYS", "NO_WAITER", "QueueGate"]

#: ``min_gpus`` and ``min_milli`` when no waiting request asks for whole GPUs, or a fraction.
NO_WAITER = 1 << 30
#: ``unspent_priority`` when every waiting request's budget is spent.
ALL_SPENT = -(1 << 62)
#: ``hold_priority`` when the pass held no node: every request that spends its budget closes the gate.
NO_HOLD = -(1 << 62)
#: The ``gpupool_meta`` keys the gate is kept in.
GATE_KEYS = (
    "queue_gate_open",
    "queue_gate_min_gpus",
    "queue_gate_min_milli",
    "queue_gate_unspent_priority",
    "queue_gate_bound",
    "queue_gate_hold_priority",
    "queue_gate_hold_seq",
)


@dataclass(frozen=True)
class QueueGate:
    """What the last pass over the queue lets later writers skip (see the module docstring)."""

    open: bool = False
    min_gpus: int = NO_WAITER
    min_milli: int = NO_WAITER
    unspent_priority: int = ALL_SPENT
    bound: int = 0
    hold_priority: int = NO_HOLD
    hold_seq: int = 0

    @classmethod
    def after_pass(
        cls,
        waiting: Iterable[GpuRequest],
        unspent: Iterable[int],
        *,
        may_skip: bool,
        bound: int = 0,
        hold: tuple[int, int] | None = None,
    ) -> QueueGate:
        """Return the gate a pass leaves.

        :param waiting: the shapes of the requests still waiting (one of each is enough)
        :param unspent: the priorities of those whose overtake budget is not spent
        :param may_skip: the pass found nothing that needs the queue served every time
        :param bound: the overtakes that spend a budget (the pass's no-starvation bound)
        :param hold: the priority and ``seq`` of the request the pass held a node for (None: none)
        """
        min_gpus = min_milli = NO_WAITER
        opened = may_skip
        for request in waiting:
            if request.gang is not None or request.mig_profile is not None:
                opened = False
            elif request.gpu_milli is not None:
                min_milli = min(min_milli, request.gpu_milli)
            elif request.gpus:
                min_gpus = min(min_gpus, request.gpus)
            else:
                opened = False  # CPU-only work fits wherever a release frees CPU
        top = max(unspent, default=ALL_SPENT)
        held = hold or (NO_HOLD, 0)
        return cls(opened, min_gpus, min_milli, top, bound, *held) if opened else cls()

    @classmethod
    def from_meta(cls, meta: Mapping[str, int | None]) -> QueueGate:
        """Read the gate from ``gpupool_meta`` values (absent: closed)."""
        values = [meta.get(key) for key in GATE_KEYS]
        if any(v is None for v in values) or not values[0]:
            return cls()
        _, *numbers = (int(v) for v in values)  # type: ignore[arg-type]
        return cls(True, *numbers)

    def to_meta(self) -> dict[str, int]:
        """Return the ``gpupool_meta`` values."""
        values = (
            int(self.open),
            self.min_gpus,
            self.min_milli,
            self.unspent_priority,
            self.bound,
            self.hold_priority,
            self.hold_seq,
        )
        return dict(zip(GATE_KEYS, values, strict=True))

    @property
    def has_waiters(self) -> bool:
        """Whether the pass left requests waiting."""
        return self.min_gpus != NO_WAITER or self.min_milli != NO_WAITER

    def lets_grant(self, request: GpuRequest) -> bool:
        """Whether ``request`` may be granted without a pass (placed outside the held nodes)."""
        return self.open and request.gang is None

    def counts(self, request: GpuRequest) -> bool:
        """Whether granting ``request`` without a pass overtakes a request whose budget is not spent."""
        return request.priority <= self.unspent_priority

    def behind_hold(self, priority: int, seq: int) -> bool:
        """Whether a request of ``priority`` queued at ``seq`` is served after the one the pass held a node for."""
        return priority < self.hold_priority or (priority == self.hold_priority and seq > self.hold_seq)

    def queued(self, request: GpuRequest) -> QueueGate:
        """Return the gate once ``request``, which fits no node, waits too (its budget not spent)."""
        whole = request.gpu_milli is None
        return replace(
            self,
            min_gpus=min(self.min_gpus, request.gpus) if whole else self.min_gpus,
            min_milli=self.min_milli if whole else min(self.min_milli, request.gpu_milli or NO_WAITER),
            unspent_priority=max(self.unspent_priority, request.priority),
        )

    def lets_release(self, node: NodeState) -> bool:
        """Whether ``node``, as a release leaves it, still fits no waiting request."""
        if not self.open:
            return False
        gpus = [g for g in node.gpus if not g.partitioned]
        whole = sum(1 for g in gpus if g.free_milli >= MILLI_PER_GPU)
        largest = max((g.free_milli for g in gpus), default=0)
        return whole < self.min_gpus and largest < self.min_milli
