"""What the ledger returns: reservations, grants and snapshots, as plain immutable values."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from airflow_gpupool.placement.snapshot import ClusterSnapshot
from airflow_gpupool.resources import GangSpec, GpuRequest


class ReservationState(str, Enum):
    """Life of a reservation: waiting, then granted, then one of the ended states.

    A granted reservation whose lease expired while a pod was bound to it is ``orphaned``: it
    still holds its slice (the pod may still run on it) until reconcile confirms the pod is
    finished or gone, or deletes it, or the reservation is released.

    A grant chosen as a preemption victim is ``preempting``: it holds its slice until its pod has
    ended (its holder then releases it, and it ends ``preempted``) or until its grace deadline,
    when it ends (or, with a pod still bound, is orphaned for the controller to delete the pod).
    The database stores it as a grant with a ``preempt_deadline``; only the value read says so.

    An ``external`` reservation is a hold for a pod this project did not make (a notebook, an
    inference Deployment, another scheduler's job) that the controller's pod watch found on a
    node's GPUs: it holds its slice as a grant does, has no lease and no team quota, is never a
    preemption victim, and ends ``released`` when its pod is gone.
    """

    WAITING = "waiting"
    GRANTED = "granted"
    PREEMPTING = "preempting"
    ORPHANED = "orphaned"
    RELEASED = "released"
    PREEMPTED = "preempted"
    EXPIRED = "expired"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    EXTERNAL = "external"

    @property
    def ended(self) -> bool:
        """Whether the reservation holds nothing and never will again."""
        return self not in _LIVE

    @property
    def holds(self) -> bool:
        """Whether the reservation holds capacity now (granted, preempting, orphaned or external)."""
        return self in _HOLDS


_HOLDS = frozenset(
    {
        ReservationState.GRANTED,
        ReservationState.PREEMPTING,
        ReservationState.ORPHANED,
        ReservationState.EXTERNAL,
    }
)
_LIVE = _HOLDS | {ReservationState.WAITING}


#: The states (stored values) that hold capacity: a grant (a preempting one included), an
#: orphan whose pod may still run on it, and an external hold (a pod this project did not make).
HOLDING_STATES = (
    ReservationState.GRANTED.value,
    ReservationState.ORPHANED.value,
    ReservationState.EXTERNAL.value,
)
#: The holder of an external hold: this prefix, then the pod's ``namespace/name``.
EXTERNAL_HOLDER_PREFIX = "external:"
#: The team column of an external hold: no team pays for it and no quota counts it.
EXTERNAL_TEAM = "external"


@dataclass(frozen=True)
class Grant:
    """The slice a reservation holds.

    :param gpu_uuids: the UUIDs of ``gpu_indices``, for device pinning
    :param gpu_uuids_verified: whether a node agent reported every one of ``gpu_uuids`` (until
        then they are the inventory's, which no NVIDIA runtime may know)
    :param mig_profile: the MIG profile of ``mig_slice``, for MIG requests
    :param pod_name: the pod bound to the grant (with ``pod_namespace``, ``pod_uid`` and
        ``bound_at``); None while no pod was asked for. The operator binds the pod by name just
        before creating it and adds the uid the server gave it, so a worker dying in between
        cannot leave a running pod on a slice the ledger frees
    :param pod_uid: the bound pod's uid; None while it is being created
    """

    node: str
    node_pool: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    gpu_model: str | None
    milli_per_gpu: int
    gpu_memory_mib: int
    mig_slice: str | None
    mig_profile: str | None
    granted_at: float
    expires_at: float
    pod_namespace: str | None = None
    pod_name: str | None = None
    pod_uid: str | None = None
    bound_at: float | None = None
    gpu_uuids_verified: bool = False

    @property
    def bound(self) -> bool:
        """Whether a pod was bound to the grant (by name, with or without its uid yet)."""
        return self.pod_name is not None

    def to_dict(self) -> dict[str, Any]:
        """Return primitives only (XCom, trigger events, JSON)."""
        out = asdict(self)
        out["gpu_indices"] = list(self.gpu_indices)
        out["gpu_uuids"] = list(self.gpu_uuids)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Grant:
        """Rebuild from :meth:`to_dict` output."""
        values = dict(data)
        values["gpu_indices"] = tuple(values["gpu_indices"])
        values["gpu_uuids"] = tuple(values["gpu_uuids"])
        return cls(**values)


@dataclass(frozen=True)
class Reservation:
    """A request and what became of it.

    :param position: 1-based place in the queue while waiting
    :param message: why it waits, or how it ended
    :param ended_at: when it was released, expired, timed out or withdrawn
    :param orphaned_at: when its lease expired with a pod bound (state ``orphaned``)
    :param gang_id: the id of its gang's leader (the leader's own id on the leader); None
        for a single reservation
    :param gang_index: its index in the gang (0: the leader)
    :param preempt_deadline: a preemption victim's deadline: its pod must have ended by then
        (state ``preempting``; kept once it ended ``preempted``)
    :param preempted_by: the waiting request it was preempted for
    :param checkpoint_at: when its holder last saw a newer valid checkpoint (None: none reported)
    :param headroom_loan: it was granted on the headroom lent to preemptible work (urgent work
        may take it back, whatever its team's quota)
    :param not_before: queued ahead: the ledger time before which it is not granted (None once due)
    :param overtakes: while it waits, the later requests granted past it so far (the queue rule
        lets none pass once this reaches ``max_overtakes``); 0 otherwise
    """

    id: str
    holder: str
    state: ReservationState
    request: GpuRequest
    created_at: float
    deadline: float
    grant: Grant | None = None
    position: int | None = None
    message: str = ""
    ended_at: float | None = None
    orphaned_at: float | None = None
    gang_id: str | None = None
    gang_index: int | None = None
    preempt_deadline: float | None = None
    preempted_by: str | None = None
    checkpoint_at: float | None = None
    headroom_loan: bool = False
    not_before: float | None = None
    overtakes: int = 0

    @property
    def waited_seconds(self) -> float:
        """How long an ended request waited, on the ledger's clock (its timeout, once timed out)."""
        return (self.ended_at if self.ended_at is not None else self.deadline) - self.created_at

    def to_dict(self) -> dict[str, Any]:
        """Return primitives only (XCom, trigger events, JSON)."""
        return {
            "id": self.id,
            "holder": self.holder,
            "state": self.state.value,
            "request": self.request.to_dict(),
            "created_at": self.created_at,
            "deadline": self.deadline,
            "grant": self.grant.to_dict() if self.grant else None,
            "position": self.position,
            "message": self.message,
            "ended_at": self.ended_at,
            "orphaned_at": self.orphaned_at,
            "gang_id": self.gang_id,
            "gang_index": self.gang_index,
            "preempt_deadline": self.preempt_deadline,
            "preempted_by": self.preempted_by,
            "checkpoint_at": self.checkpoint_at,
            "headroom_loan": self.headroom_loan,
            "not_before": self.not_before,
            "overtakes": self.overtakes,
        }


@dataclass(frozen=True)
class Gang:
    """A gang reservation: its leader and every member row, by index.

    :param leader_id: the leader's id, which reserving returned (member 0)
    :param spec: the gang's members, minimum and topology keys
    :param members: by ``gang_index``: granted, waiting (elastic growth) or ended; only the
        leader exists while the gang waits
    """

    leader_id: str
    spec: GangSpec
    members: tuple[Reservation, ...]

    @property
    def granted(self) -> tuple[Reservation, ...]:
        """The members that hold their slice now (granted or orphaned)."""
        return tuple(m for m in self.members if m.state.holds)

    @property
    def state(self) -> ReservationState:
        """The leader's state: the gang's."""
        return self.members[0].state


@dataclass(frozen=True)
class ReleaseResult:
    """Outcome of a release: ``released`` is False when it was a no-op, and ``message`` says why."""

    reservation_id: str
    released: bool
    state: ReservationState
    message: str


@dataclass(frozen=True)
class ReapResult:
    """What one reap did."""

    expired: tuple[str, ...] = ()
    timed_out: tuple[str, ...] = ()
    granted: tuple[str, ...] = ()
    orphaned: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeRecord:
    """A node as stored, with its health and GPUs (UUIDs included) for the CLI and UI."""

    name: str
    node_pool: str
    health: str
    labels: dict[str, str]
    cpu_milli: int
    memory_mib: int
    cpu_free: int
    memory_free: int
    heartbeat_at: float | None
    gpus: tuple[dict[str, Any], ...]
    health_source: str = "inventory"
    health_reason: str | None = None
    heartbeat_interval: float | None = None


@dataclass(frozen=True)
class LedgerSnapshot:
    """One consistent view of the whole ledger."""

    taken_at: float
    cluster: ClusterSnapshot
    nodes: tuple[NodeRecord, ...]
    grants: tuple[Reservation, ...]
    queue: tuple[Reservation, ...]
    gpu_capacity_milli: int = 0
    gpu_allocated_milli: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: The pods this project did not make that hold GPUs (state ``external``), one row per GPU or slice.
    external: tuple[Reservation, ...] = ()

    @property
    def allocation(self) -> float:
        """Share of the GPU compute that is granted (0–1)."""
        return self.gpu_allocated_milli / self.gpu_capacity_milli if self.gpu_capacity_milli else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Return primitives only: the one JSON form of a snapshot (``gpupool status --json``, the UI's API)."""
        return {
            "taken_at": self.taken_at,
            "gpu_capacity_milli": self.gpu_capacity_milli,
            "gpu_allocated_milli": self.gpu_allocated_milli,
            "allocation": self.allocation,
            "nodes": [
                {
                    "name": n.name,
                    "node_pool": n.node_pool,
                    "health": n.health,
                    "labels": n.labels,
                    "cpu_milli": n.cpu_milli,
                    "cpu_free": n.cpu_free,
                    "memory_mib": n.memory_mib,
                    "memory_free": n.memory_free,
                    "heartbeat_at": n.heartbeat_at,
                    "health_source": n.health_source,
                    "health_reason": n.health_reason,
                    "heartbeat_age_s": None
                    if n.heartbeat_at is None
                    else max(0.0, self.taken_at - n.heartbeat_at),
                    "gpus": [{k: v for k, v in g.items() if k != "node"} for g in n.gpus],
                }
                for n in self.nodes
            ],
            "grants": [r.to_dict() for r in self.grants],
            "external": [r.to_dict() for r in self.external],
            "queue": [r.to_dict() for r in self.queue],
            "orphaned": [r.id for r in self.grants if r.state is ReservationState.ORPHANED],
            # The node agent's GPU memory leaks past their grace (schema v7).
            "leaks": [
                {"node": n.name, "gpu": g["uuid"], **g["leak"]}
                for n in self.nodes
                for g in n.gpus
                if g.get("leak")
            ],
        }
