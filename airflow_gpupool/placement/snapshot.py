"""An immutable view of the cluster's free capacity: what placement decides on."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from airflow_gpupool.resources import MILLI_PER_GPU


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU's free capacity.

    :param index: the GPU's index on its node
    :param model: the GPU model (``A100-SXM4-80GB``, ``T4``, ``G2``...)
    :param memory_mib: the GPU's total memory
    :param free_milli: unallocated compute in milli-GPU (0 on a MIG-partitioned GPU)
    :param free_memory_mib: unallocated GPU memory
    :param mig_free: free MIG slices as ``(slice_id, profile)`` pairs
    :param partitioned: whether the GPU is MIG-partitioned (only MIG requests use it)
    :param quarantined: whether the GPU is quarantined; the ledger then also shows it partitioned
        with no free slice, so nothing fits it; this says why, for the reasons
    """

    index: int
    model: str
    memory_mib: int
    free_milli: int = MILLI_PER_GPU
    free_memory_mib: int = -1
    mig_free: tuple[tuple[str, str], ...] = ()
    partitioned: bool = False
    quarantined: bool = False

    def __post_init__(self) -> None:
        if self.free_memory_mib < 0:
            object.__setattr__(self, "free_memory_mib", self.memory_mib)

    @property
    def is_free(self) -> bool:
        """Whether nothing is allocated on this (unpartitioned) GPU."""
        return not self.partitioned and self.free_milli == MILLI_PER_GPU


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node's capacity and what is free on it.

    :param classes: workload classes that hold grants on the node (training and inference never mix)
    :param schedulable: False for cordoned, draining or quarantined nodes
    :param health: which of those it is, for the reasons (None: not said)
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuState, ...] = ()
    cpu_free: int = -1
    memory_free: int = -1
    labels: tuple[tuple[str, str], ...] = ()
    classes: frozenset[str] = field(default_factory=frozenset)
    schedulable: bool = True
    node_pool: str = "default"
    health: str | None = None

    def __post_init__(self) -> None:
        if self.cpu_free < 0:
            object.__setattr__(self, "cpu_free", self.cpu_milli)
        if self.memory_free < 0:
            object.__setattr__(self, "memory_free", self.memory_mib)

    @property
    def gpu_free_milli(self) -> int:
        """Free compute over the node's unpartitioned GPUs, in milli-GPU."""
        return sum(g.free_milli for g in self.gpus if not g.partitioned)

    @property
    def free_whole_gpus(self) -> int:
        """How many GPUs have nothing allocated."""
        return sum(1 for g in self.gpus if g.is_free)

    @property
    def models(self) -> frozenset[str]:
        """The GPU models on this node."""
        return frozenset(g.model for g in self.gpus)


@dataclass(frozen=True)
class ClusterSnapshot:
    """All nodes, in a fixed order that policies use to break ties.

    :param base: the snapshot this one derives from, and ``changed`` the positions of the
        nodes that differ from it: a hint that lets a policy that saw ``base`` last skip
        comparing every node (one that did not compares them all); see :meth:`derive`
    :param changed: see ``base``
    """

    nodes: tuple[NodeState, ...]
    base: ClusterSnapshot | None = field(default=None, compare=False, repr=False)
    changed: tuple[int, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))

    def node(self, name: str) -> NodeState:
        """Return the node called ``name``; KeyError if absent."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def with_node(self, new: NodeState) -> ClusterSnapshot:
        """Return a snapshot with the node of the same name replaced by ``new``."""
        return replace(
            self, nodes=tuple(new if n.name == new.name else n for n in self.nodes), base=None, changed=()
        )

    def derive(self, nodes: tuple[NodeState, ...], changed: tuple[int, ...]) -> ClusterSnapshot:
        """Return the snapshot of ``nodes``, which differ from this one's at positions ``changed`` only.

        Only the last step is kept: this snapshot forgets its own ``base``, so a long chain of
        derived snapshots holds two at a time, not all of them.
        """
        object.__setattr__(self, "base", None)
        object.__setattr__(self, "changed", ())
        return ClusterSnapshot(nodes, base=self, changed=changed)

    @property
    def gpu_capacity_milli(self) -> int:
        """Total GPU compute of the cluster in milli-GPU."""
        return sum(len(n.gpus) for n in self.nodes) * MILLI_PER_GPU
