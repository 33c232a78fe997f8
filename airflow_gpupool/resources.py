"""The resource model: what a task asks for, and what a node has.

Value types only, no I/O. Every type validates itself on construction and raises
:class:`~airflow_gpupool.exceptions.InvalidRequestError` naming the bad field and what
would have been accepted, so a bad request fails when the DAG is parsed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from airflow_gpupool.exceptions import InvalidGangError, InvalidInventoryError, InvalidRequestError

MILLI_PER_GPU = 1000
MAX_CPU_MILLI = 10_000_000  # 10,000 cores: anything above is a unit mistake
MAX_MEMORY_MIB = 64 * 1024 * 1024  # 64 TiB
MAX_GPUS_PER_REQUEST = 64
MAX_GPU_MEMORY_MIB = 1024 * 1024  # 1 TiB on one GPU
MAX_ABS_PRIORITY = 1_000_000
MAX_GANG_MEMBERS = 512
MAX_GRACE_SECONDS = 86_400  # a day: a preemption victim needs minutes to checkpoint, not days

_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.:/]*[A-Za-z0-9])?$")


class WorkloadClass(str, Enum):
    """What a request runs; training and inference never share a node."""

    TRAINING = "training"
    INFERENCE = "inference"
    BATCH = "batch"


class GpuKind(str, Enum):
    """The shape of a request's GPU part."""

    NONE = "none"
    WHOLE = "whole"
    FRACTION = "fraction"
    MIG = "mig"


class NodeHealth(str, Enum):
    """Whether a node takes new grants; only ``healthy`` does."""

    HEALTHY = "healthy"
    CORDONED = "cordoned"
    DRAINING = "draining"
    QUARANTINED = "quarantined"


@dataclass(frozen=True)
class MigProfile:
    """One NVIDIA MIG profile: compute slices out of 7 and memory in GB."""

    name: str
    compute_slices: int
    memory_gb: int
    family_gb: int

    @property
    def milli(self) -> int:
        """Share of the GPU's compute, in milli-GPU, used for allocation accounting."""
        return round(self.compute_slices * MILLI_PER_GPU / 7)


def _profiles(family_gb: int, names: Iterable[str]) -> dict[str, MigProfile]:
    out = {}
    for name in names:
        g, mem = name.split(".")
        out[name] = MigProfile(name, int(g.rstrip("g")), int(mem.rstrip("gb")), family_gb)
    return out


#: The MIG profiles of the A100 40 GB, the A100/H100 80 GB and the H200 141 GB families.
MIG_PROFILES: dict[str, MigProfile] = {
    **_profiles(40, ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
    # 1g.10gb also exists on the 40 GB A100 (two memory slices); a slice is matched by name.
    **_profiles(80, ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    **_profiles(141, ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]),
}


def _check_int(
    name: str, value: Any, low: int, high: int, error: type[InvalidRequestError] = InvalidRequestError
) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(name, value, f"an integer in [{low}, {high}]")
    if not low <= value <= high:
        raise error(name, value, f"an integer in [{low}, {high}]")
    return value


def _check_name(name: str, value: Any, error: type[InvalidRequestError] = InvalidRequestError) -> str:
    if not isinstance(value, str) or not _NAME.match(value) or len(value) > 253:
        raise error(name, value, "a non-empty name of letters, digits and -_.:/ (at most 253 characters)")
    return value


def normalize_labels(
    name: str, labels: Mapping[str, str] | Iterable[tuple[str, str]] | None, error: type[InvalidRequestError]
) -> tuple[tuple[str, str], ...]:
    """Return labels as a sorted tuple of pairs, checked against Kubernetes label syntax."""
    if labels is None:
        return ()
    items = labels.items() if isinstance(labels, Mapping) else labels
    try:
        pairs = [(k, v) for k, v in items]
    except (TypeError, ValueError) as e:
        raise error(name, labels, "a mapping of label key to value") from e
    for key, value in pairs:
        if not isinstance(key, str) or not _LABEL_KEY.match(key) or len(key) > 316:
            raise error(f"{name}[{key!r}]", key, "a Kubernetes label key such as 'nvidia.com/gpu.product'")
        if not isinstance(value, str) or not _LABEL_VALUE.match(value) or len(value) > 63:
            raise error(f"{name}[{key!r}]", value, "a Kubernetes label value (at most 63 characters)")
    return tuple(sorted(dict(pairs).items()))


@dataclass(frozen=True)
class GangSpec:
    """A gang: members of one shape granted all or nothing, across nodes.

    :param members: the most members (``gang_max``); a fixed gang has ``members == min_members``
    :param min_members: granted all or nothing at this many; an elastic gang (fewer than
        ``members``) grows towards ``members`` as capacity frees
    :param topology_keys: node label keys (zone, rack, NVLink domain) whose shared values
        placement prefers for the members, after the fewest nodes
    """

    members: int
    min_members: int
    topology_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_int("gang members", self.members, 1, MAX_GANG_MEMBERS, InvalidGangError)
        _check_int("gang min_members", self.min_members, 1, self.members, InvalidGangError)
        keys = self.topology_keys
        if isinstance(keys, str) or not isinstance(keys, Iterable):
            raise InvalidGangError("gang topology_keys", keys, "a list of node label keys")
        keys = tuple(keys)
        for key in keys:
            if not isinstance(key, str) or not _LABEL_KEY.match(key) or len(key) > 316:
                raise InvalidGangError(
                    "gang topology_keys", key, "Kubernetes label keys such as 'topology.kubernetes.io/zone'"
                )
        if len(set(keys)) != len(keys):
            raise InvalidGangError("gang topology_keys", list(keys), "each key once")
        object.__setattr__(self, "topology_keys", keys)

    @property
    def elastic(self) -> bool:
        """Whether the gang may hold more than its minimum."""
        return self.members > self.min_members

    def describe(self) -> str:
        """Return ``gang of 3`` or, for an elastic gang, ``gang of 2-4``."""
        if self.elastic:
            return f"gang of {self.min_members}-{self.members}"
        return f"gang of {self.members}"

    def to_dict(self) -> dict[str, Any]:
        """Return primitive values only."""
        return {
            "members": self.members,
            "min_members": self.min_members,
            "topology_keys": list(self.topology_keys),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GangSpec:
        """Rebuild a spec from :meth:`to_dict` output; unknown keys are an error."""
        if not isinstance(data, Mapping):
            raise InvalidGangError("gang", data, "a mapping with members, min_members and topology_keys")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise InvalidGangError("gang", sorted(unknown), f"keys among {sorted(cls.__dataclass_fields__)}")
        values = dict(data)
        values.setdefault("min_members", values.get("members"))
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class GpuRequest:
    """What one task asks for.

    The GPU part is one of: ``gpus=n`` whole GPUs; a fraction of one GPU
    (``gpu_milli`` 1–999, optionally ``gpu_memory_mib``); a ``mig_profile``; or nothing
    (CPU only, ``gpus=0``).

    :param cpu_milli: CPU in thousandths of a core
    :param memory_mib: host memory in MiB
    :param gpus: number of whole GPUs (0 with a fraction or MIG profile)
    :param gpu_milli: thousandths of one GPU for a shared slice
    :param gpu_memory_mib: GPU memory the slice needs (fractions), or the least memory each whole GPU must have
    :param mig_profile: a MIG profile name such as ``1g.10gb``
    :param gpu_models: GPU models allowed (empty: any)
    :param node_labels: labels the node must carry (data locality, node pools)
    :param prefer_node_labels: labels a node should carry (soft: data locality, a local NVMe
        or a dataset's cache); among the nodes placement scores equally well, those carrying
        all of them come first, and a request never fails for lack of them (placement issue 13)
    :param workload_class: ``training``, ``inference`` or ``batch``
    :param priority: higher is served first
    :param team: the team that pays for it
    :param preemptible: whether higher-priority work may take its slice back
    :param preemption_grace_seconds: as a preemption victim, how long its pod has to write an
        emergency checkpoint and end (None: ``[gpupool] preemption_grace_seconds``)
    :param preempts: whether it may preempt others; False for the retry of a preempted try, so
        preemption never cascades
    :param checkpoint_on_sigterm: its pod writes a checkpoint on SIGTERM within its grace, so as a
        preemption victim it loses no work: victims are ranked as if checkpointed now
    :param gang: None for one slice; else a gang of members, each of this request's shape,
        granted all or nothing (:class:`GangSpec`)
    """

    cpu_milli: int = 1000
    memory_mib: int = 1024
    gpus: int = 0
    gpu_milli: int | None = None
    gpu_memory_mib: int | None = None
    mig_profile: str | None = None
    gpu_models: frozenset[str] = field(default_factory=frozenset)
    node_labels: tuple[tuple[str, str], ...] = ()
    prefer_node_labels: tuple[tuple[str, str], ...] = ()
    workload_class: WorkloadClass = WorkloadClass.BATCH
    priority: int = 0
    team: str = "default"
    preemptible: bool = False
    gang: GangSpec | None = None
    preemption_grace_seconds: float | None = None
    preempts: bool = True
    checkpoint_on_sigterm: bool = False

    def __post_init__(self) -> None:
        _check_int("cpu_milli", self.cpu_milli, 0, MAX_CPU_MILLI)
        _check_int("memory_mib", self.memory_mib, 0, MAX_MEMORY_MIB)
        _check_int("gpus", self.gpus, 0, MAX_GPUS_PER_REQUEST)
        _check_int("priority", self.priority, -MAX_ABS_PRIORITY, MAX_ABS_PRIORITY)
        if self.gpu_memory_mib is not None:
            _check_int("gpu_memory_mib", self.gpu_memory_mib, 1, MAX_GPU_MEMORY_MIB)
        self._check_gpu_part()
        self._normalize_constraints()
        if not isinstance(self.preemptible, bool):
            raise InvalidRequestError("preemptible", self.preemptible, "True or False")
        if not isinstance(self.preempts, bool):
            raise InvalidRequestError("preempts", self.preempts, "True or False")
        if not isinstance(self.checkpoint_on_sigterm, bool):
            raise InvalidRequestError("checkpoint_on_sigterm", self.checkpoint_on_sigterm, "True or False")
        if self.preemption_grace_seconds is not None:
            grace = self.preemption_grace_seconds
            if (
                isinstance(grace, bool)
                or not isinstance(grace, int | float)
                or not 0 < grace <= MAX_GRACE_SECONDS
            ):
                raise InvalidRequestError(
                    "preemption_grace_seconds",
                    grace,
                    f"a number of seconds in (0, {MAX_GRACE_SECONDS}], or None",
                )
            object.__setattr__(self, "preemption_grace_seconds", float(grace))
        _check_name("team", self.team)
        if self.gang is not None and not isinstance(self.gang, GangSpec):
            object.__setattr__(self, "gang", GangSpec.from_dict(self.gang))

    def _check_gpu_part(self) -> None:
        if self.gpu_milli is not None:
            _check_int("gpu_milli", self.gpu_milli, 1, MILLI_PER_GPU - 1)
            if self.gpus > 1:
                raise InvalidRequestError(
                    "gpus", self.gpus, "0 or 1 with gpu_milli (a fraction is a share of one GPU)"
                )
            if self.mig_profile is not None:
                raise InvalidRequestError("mig_profile", self.mig_profile, "None when gpu_milli is set")
            object.__setattr__(self, "gpus", 1)
        if self.mig_profile is not None:
            if self.mig_profile not in MIG_PROFILES:
                raise InvalidRequestError("mig_profile", self.mig_profile, f"one of {sorted(MIG_PROFILES)}")
            if self.gpus > 1:
                raise InvalidRequestError("gpus", self.gpus, "0 or 1 with mig_profile")
            if self.gpu_memory_mib is not None:
                raise InvalidRequestError(
                    "gpu_memory_mib", self.gpu_memory_mib, "None with mig_profile (the profile fixes memory)"
                )
            object.__setattr__(self, "gpus", 0)
        if self.kind is GpuKind.NONE and self.gpu_memory_mib is not None:
            raise InvalidRequestError("gpu_memory_mib", self.gpu_memory_mib, "None when no GPU is requested")

    def _normalize_constraints(self) -> None:
        models = self.gpu_models
        if isinstance(models, str):
            models = frozenset(m for m in models.split("|") if m)
        if not isinstance(models, Iterable):
            raise InvalidRequestError("gpu_models", models, "a list of GPU model names")
        models = frozenset(models)
        for model in models:
            _check_name("gpu_models", model)
        object.__setattr__(self, "gpu_models", models)
        object.__setattr__(
            self, "node_labels", normalize_labels("node_labels", self.node_labels, InvalidRequestError)
        )
        object.__setattr__(
            self,
            "prefer_node_labels",
            normalize_labels("prefer_node_labels", self.prefer_node_labels, InvalidRequestError),
        )
        try:
            object.__setattr__(self, "workload_class", WorkloadClass(self.workload_class))
        except ValueError as e:
            allowed = [c.value for c in WorkloadClass]
            raise InvalidRequestError("workload_class", self.workload_class, f"one of {allowed}") from e

    @property
    def kind(self) -> GpuKind:
        """Which GPU part this request has."""
        if self.mig_profile is not None:
            return GpuKind.MIG
        if self.gpu_milli is not None:
            return GpuKind.FRACTION
        return GpuKind.WHOLE if self.gpus else GpuKind.NONE

    @property
    def total_gpu_milli(self) -> int:
        """GPU compute asked for, in milli-GPU (a MIG slice counts its share of 7 slices)."""
        if self.kind is GpuKind.MIG:
            return MIG_PROFILES[str(self.mig_profile)].milli
        if self.kind is GpuKind.FRACTION:
            return int(self.gpu_milli or 0)
        return self.gpus * MILLI_PER_GPU

    def describe(self) -> str:
        """Return a short human description such as ``2 GPU`` or ``0.25 GPU + 8192 MiB``."""
        if self.kind is GpuKind.MIG:
            part = f"MIG {self.mig_profile}"
        elif self.kind is GpuKind.FRACTION:
            part = f"{(self.gpu_milli or 0) / MILLI_PER_GPU:g} GPU"
        elif self.kind is GpuKind.WHOLE:
            part = f"{self.gpus} GPU"
        else:
            part = "no GPU"
        if self.gpu_memory_mib:
            part += f" ({self.gpu_memory_mib} MiB GPU memory)"
        if self.gpu_models:
            part += f" on {'|'.join(sorted(self.gpu_models))}"
        shape = f"{part}, {self.cpu_milli}m CPU, {self.memory_mib} MiB"
        return shape if self.gang is None else f"{self.gang.describe()} × {shape}"

    @property
    def member(self) -> GpuRequest:
        """The shape of one member of a gang (this request without its gang); the request itself otherwise."""
        return self if self.gang is None else replace(self, gang=None)

    def to_dict(self) -> dict[str, Any]:
        """Return primitive values only, for JSON columns, XCom and trigger serialization."""
        out: dict[str, Any] = {
            "cpu_milli": self.cpu_milli,
            "memory_mib": self.memory_mib,
            "gpus": self.gpus,
            "gpu_milli": self.gpu_milli,
            "gpu_memory_mib": self.gpu_memory_mib,
            "mig_profile": self.mig_profile,
            "gpu_models": sorted(self.gpu_models),
            "node_labels": dict(self.node_labels),
            "workload_class": self.workload_class.value,
            "priority": self.priority,
            "team": self.team,
            "preemptible": self.preemptible,
            "prefer_node_labels": dict(self.prefer_node_labels),
        }
        # Only gangs carry the key: the texts of other requests stay as they were stored.
        if self.gang is not None:
            out["gang"] = self.gang.to_dict()
        # The same for the preemption keys: only where they differ from the defaults.
        if self.preemption_grace_seconds is not None:
            out["preemption_grace_seconds"] = self.preemption_grace_seconds
        if not self.preempts:
            out["preempts"] = False
        if self.checkpoint_on_sigterm:
            out["checkpoint_on_sigterm"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuRequest:
        """Rebuild a request from :meth:`to_dict` output; unknown keys are an error."""
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise InvalidRequestError(
                "request", sorted(unknown), f"keys among {sorted(cls.__dataclass_fields__)}"
            )
        values = dict(data)
        if (
            "gpu_models" in values
            and values["gpu_models"] is not None
            and not isinstance(values["gpu_models"], str)
        ):
            values["gpu_models"] = frozenset(values["gpu_models"])
        if values.get("gang") is not None:
            values["gang"] = GangSpec.from_dict(values["gang"])
        return cls(**values)


@dataclass(frozen=True)
class MigSlice:
    """One MIG instance carved out of a GPU."""

    slice_id: str
    profile: str

    def __post_init__(self) -> None:
        _check_name("mig slice id", self.slice_id, InvalidInventoryError)
        if self.profile not in MIG_PROFILES:
            raise InvalidInventoryError("mig profile", self.profile, f"one of {sorted(MIG_PROFILES)}")


@dataclass(frozen=True)
class GpuDevice:
    """One physical GPU of a node; partitioned when it has MIG slices."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    mig_slices: tuple[MigSlice, ...] = ()

    def __post_init__(self) -> None:
        _check_name("gpu uuid", self.uuid, InvalidInventoryError)
        _check_name("gpu model", self.model, InvalidInventoryError)
        try:
            _check_int("gpu index", self.index, 0, 1023)
            _check_int("gpu memory_mib", self.memory_mib, 1, MAX_GPU_MEMORY_MIB)
        except InvalidRequestError as e:
            raise InvalidInventoryError(e.field, e.value, e.expected) from None
        object.__setattr__(self, "mig_slices", tuple(self.mig_slices))
        compute = sum(MIG_PROFILES[s.profile].compute_slices for s in self.mig_slices)
        if compute > 7:
            raise InvalidInventoryError(
                f"gpu {self.index} mig_slices",
                [s.profile for s in self.mig_slices],
                "at most 7 compute slices",
            )
        ids = [s.slice_id for s in self.mig_slices]
        if len(set(ids)) != len(ids):
            raise InvalidInventoryError(f"gpu {self.index} mig_slices", ids, "unique slice ids")


@dataclass(frozen=True)
class NodeInventory:
    """One node as the ledger knows it."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuDevice, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    node_pool: str = "default"
    health: NodeHealth = NodeHealth.HEALTHY

    def __post_init__(self) -> None:
        _check_name("node name", self.name, InvalidInventoryError)
        try:
            _check_int("cpu_milli", self.cpu_milli, 0, MAX_CPU_MILLI)
            _check_int("memory_mib", self.memory_mib, 0, MAX_MEMORY_MIB)
        except InvalidRequestError as e:
            raise InvalidInventoryError(f"node {self.name} {e.field}", e.value, e.expected) from None
        object.__setattr__(self, "gpus", tuple(self.gpus))
        object.__setattr__(self, "labels", normalize_labels("labels", self.labels, InvalidInventoryError))
        _check_name("node_pool", self.node_pool, InvalidInventoryError)
        try:
            object.__setattr__(self, "health", NodeHealth(self.health))
        except ValueError as e:
            allowed = [h.value for h in NodeHealth]
            raise InvalidInventoryError("health", self.health, f"one of {allowed}") from e
        indices = [g.index for g in self.gpus]
        if len(set(indices)) != len(indices):
            raise InvalidInventoryError(f"node {self.name} gpu indices", indices, "unique indices")
        uuids = [g.uuid for g in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise InvalidInventoryError(f"node {self.name} gpu uuids", uuids, "unique UUIDs")
