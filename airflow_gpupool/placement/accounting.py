"""Apply and undo an assignment on a node's free capacity (pure)."""

from __future__ import annotations

from dataclasses import replace

from airflow_gpupool.placement.fit import EXCLUSIVE_CLASSES, choices
from airflow_gpupool.placement.snapshot import GpuState, NodeState
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest


def _gpu_after(gpu: GpuState, assignment: Assignment, request: GpuRequest, sign: int) -> GpuState:
    if assignment.mig_slice is not None:
        if sign < 0:
            free = tuple(s for s in gpu.mig_free if s[0] != assignment.mig_slice)
        else:
            free = tuple(sorted((*gpu.mig_free, (assignment.mig_slice, str(request.mig_profile)))))
        return replace(gpu, mig_free=free)
    return replace(
        gpu,
        free_milli=gpu.free_milli + sign * assignment.milli_per_gpu,
        free_memory_mib=gpu.free_memory_mib + sign * assignment.gpu_memory_mib,
    )


def _shift(
    node: NodeState, request: GpuRequest, assignment: Assignment, sign: int, classes: frozenset[str]
) -> NodeState:
    taken = set(assignment.gpu_indices)
    gpus = tuple(_gpu_after(g, assignment, request, sign) if g.index in taken else g for g in node.gpus)
    return replace(
        node,
        gpus=gpus,
        cpu_free=node.cpu_free + sign * request.cpu_milli,
        memory_free=node.memory_free + sign * request.memory_mib,
        classes=classes,
    )


def allocate(node: NodeState, request: GpuRequest, assignment: Assignment) -> NodeState:
    """Return ``node`` with ``assignment`` taken out of its free capacity."""
    classes = node.classes
    if request.workload_class.value in EXCLUSIVE_CLASSES:
        classes = classes | {request.workload_class.value}
    return _shift(node, request, assignment, -1, classes)


def deallocate(
    node: NodeState, request: GpuRequest, assignment: Assignment, classes: frozenset[str]
) -> NodeState:
    """Return ``node`` with ``assignment`` given back; ``classes`` are the classes still on the node."""
    return _shift(node, request, assignment, +1, classes)


def hand_on(
    node: NodeState,
    upstream: GpuRequest,
    held: Assignment,
    downstream: GpuRequest,
    classes: frozenset[str],
) -> Assignment | None:
    """Return the part of an ending grant's slice that a downstream request takes, or None.

    Hand-on passes a step's slice to the next step of the same DAG run instead of releasing
    it: the downstream takes only GPUs the upstream held (on the same node, no more compute or
    memory on each than the upstream had there), so a hand-on never takes what another grant
    could have had. CPU and memory come from the node with the upstream's given back. A MIG
    slice is not handed on.

    :param node: the node as it is, the upstream's slice still taken
    :param upstream: the ending grant's request
    :param held: the ending grant's assignment
    :param downstream: the request of the step that would take the slice
    :param classes: the exclusive classes left on the node once the upstream's grant ends
    """
    if held.mig_slice is not None or downstream.mig_profile is not None:
        return None
    freed = deallocate(node, upstream, held, classes)
    mine = set(held.gpu_indices)
    gpus = tuple(
        replace(g, free_milli=held.milli_per_gpu, free_memory_mib=held.gpu_memory_mib)
        if g.index in mine
        else replace(g, free_milli=0, free_memory_mib=0, mig_free=())
        for g in freed.gpus
    )
    found = choices(replace(freed, gpus=gpus), downstream)
    return found[0] if isinstance(found, list) and found else None
