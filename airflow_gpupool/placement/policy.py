"""The placement interface every policy implements, and the registry of policies by name."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from airflow_gpupool import settings
from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.placement.fit import choices
from airflow_gpupool.placement.frag import DEFAULT_SHAPES, TypicalShape
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.placement.verdict import Assignment, NoFit, NoFitReason, Verdict
from airflow_gpupool.resources import GpuRequest


class PlacementPolicy(Protocol):
    """Chooses where a request goes; pure: no I/O, no mutation of the snapshot."""

    name: str

    def place(self, snapshot: ClusterSnapshot, request: GpuRequest) -> Verdict:
        """Return an :class:`Assignment`, or a :class:`NoFit` with sorted reasons."""
        ...


def no_fit(reasons: Iterable[NoFitReason]) -> NoFit:
    """Return a NoFit with the closest nodes first."""
    return NoFit(tuple(sorted(reasons)))


def place_by_score(
    snapshot: ClusterSnapshot,
    request: GpuRequest,
    score: Callable[[NodeState, Assignment], float],
) -> Verdict:
    """Place on the feasible choice with the lowest ``score``; ties keep snapshot order."""
    best: Assignment | None = None
    best_score = 0.0
    reasons: list[NoFitReason] = []
    for node in snapshot.nodes:
        options = choices(node, request)
        if isinstance(options, NoFitReason):
            reasons.append(options)
            continue
        for option in options:
            value = score(node, option)
            if best is None or value < best_score:
                best, best_score = option, value
    if best is None:
        return no_fit(reasons)
    return Assignment(
        best.node, best.gpu_indices, best.milli_per_gpu, best.gpu_memory_mib, best.mig_slice, best_score
    )


#: The policy the project recommends and the ledger should default to: FGD's fragmentation
#: gradient plus the GPU capacity a placement strands for lack of CPU, best fit inside a
#: score band (see :class:`~airflow_gpupool.placement.fgd.GpuPoolPolicy`).
DEFAULT_POLICY = settings.DEFAULT_POLICY

_REGISTRY: dict[str, Callable[..., PlacementPolicy]] = {}


def register(name: str) -> Callable[[Callable[..., PlacementPolicy]], Callable[..., PlacementPolicy]]:
    """Register a policy factory under ``name`` (a class decorator)."""

    def wrap(factory: Callable[..., PlacementPolicy]) -> Callable[..., PlacementPolicy]:
        _REGISTRY[name] = factory
        return factory

    return wrap


def policy_names() -> list[str]:
    """Return the registered policy names, sorted."""
    _load_builtin()
    return sorted(_REGISTRY)


def get_policy(name: str, **options: Any) -> PlacementPolicy:
    """Return a new policy instance by name.

    Every policy accepts ``typical_shapes``; when it is not given, the shapes are those of
    :func:`configured_shapes`, the same for every worker that reads the same configuration.

    :param name: a registered policy name, see :func:`policy_names`
    :param options: policy options (``seed`` for the randomized ones, ``typical_shapes``)
    :raises ConfigurationError: for an unknown name or a malformed ``[gpupool] typical_shapes``
    """
    _load_builtin()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown placement policy {name!r}: choose one of {sorted(_REGISTRY)}"
        ) from None
    if options.get("typical_shapes") is None:
        options["typical_shapes"] = configured_shapes()
    return factory(**options)


def configured_shapes() -> tuple[TypicalShape, ...]:
    """Return the shapes of ``[gpupool] typical_shapes``, weights summing to 1 (unset: :data:`DEFAULT_SHAPES`).

    :raises ConfigurationError: the option is malformed
    """
    configured = settings.typical_shapes()
    if not configured:
        return DEFAULT_SHAPES
    total = sum(weight for *_, weight in configured)
    return tuple(
        TypicalShape(cpu, milli, gpus, models, weight / total)
        for cpu, milli, gpus, models, weight in configured
    )


def _load_builtin() -> None:
    # Importing the modules registers their policies; done lazily to avoid import cycles.
    from airflow_gpupool.placement import baselines, bestfit, fgd  # noqa: F401
