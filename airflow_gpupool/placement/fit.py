"""Feasibility: which ways a request can be placed on one node, or why it cannot.

Every policy calls these functions, so all of them agree on what "fits" means: CPU,
memory, GPU model, node labels, the workload-class rule, then the GPU part (whole
GPUs, a fraction of one GPU with its memory, or a free MIG slice of the profile).
"""

from __future__ import annotations

from airflow_gpupool.placement.snapshot import GpuState, NodeState
from airflow_gpupool.placement.verdict import Assignment, NoFitReason
from airflow_gpupool.resources import MIG_PROFILES, MILLI_PER_GPU, GpuKind, GpuRequest, WorkloadClass

#: Workload classes that may not share a node with each other.
EXCLUSIVE_CLASSES = {
    WorkloadClass.TRAINING.value: WorkloadClass.INFERENCE.value,
    WorkloadClass.INFERENCE.value: WorkloadClass.TRAINING.value,
}


def fraction_memory(request: GpuRequest, gpu: GpuState) -> int:
    """GPU memory a fraction takes: what it asked for, else its share of the GPU's memory."""
    if request.gpu_memory_mib is not None:
        return request.gpu_memory_mib
    return (request.gpu_milli or 0) * gpu.memory_mib // MILLI_PER_GPU


def _short(need: float, have: float) -> float:
    return (need - have) / need if need > 0 else 1.0


def check_node(node: NodeState, request: GpuRequest) -> NoFitReason | None:
    """Return why ``request`` cannot go on ``node`` for reasons other than its GPUs, or None."""
    if not node.schedulable:
        return NoFitReason(2.0, node.name, "node is not schedulable (cordoned, draining or quarantined)")
    for key, value in request.node_labels:
        if (key, value) not in node.labels:
            return NoFitReason(2.0, node.name, f"node lacks label {key}={value}")
    conflicting = EXCLUSIVE_CLASSES.get(request.workload_class.value)
    if conflicting is not None and conflicting in node.classes:
        return NoFitReason(
            1.5, node.name, f"node runs {conflicting} work; {request.workload_class.value} may not share it"
        )
    if request.cpu_milli > node.cpu_free:
        return NoFitReason(
            _short(request.cpu_milli, node.cpu_free),
            node.name,
            f"needs {request.cpu_milli}m CPU, {node.cpu_free}m free",
        )
    if request.memory_mib > node.memory_free:
        return NoFitReason(
            _short(request.memory_mib, node.memory_free),
            node.name,
            f"needs {request.memory_mib} MiB memory, {node.memory_free} MiB free",
        )
    return None


def gpu_model_ok(request: GpuRequest, gpu: GpuState) -> bool:
    """Whether the request accepts this GPU's model."""
    return not request.gpu_models or gpu.model in request.gpu_models


def choices(node: NodeState, request: GpuRequest) -> list[Assignment] | NoFitReason:
    """Return every distinct way ``request`` fits ``node`` now, or why it does not.

    Whole GPUs yield one choice (the lowest free indices: free GPUs are interchangeable),
    a fraction one choice per GPU it fits, a MIG request one choice per GPU with a free
    slice of its profile.
    """
    rejected = check_node(node, request)
    if rejected is not None:
        return rejected
    kind = request.kind
    if kind is GpuKind.NONE:
        return [Assignment(node.name, (), 0, 0)]
    if kind is GpuKind.WHOLE:
        return _whole(node, request)
    if kind is GpuKind.FRACTION:
        return _fraction(node, request)
    return _mig(node, request)


def _model_reason(node: NodeState, request: GpuRequest) -> NoFitReason:
    models = "|".join(sorted(request.gpu_models))
    have = "|".join(sorted(node.models)) or "no GPUs"
    return NoFitReason(2.0, node.name, f"needs GPU model {models}, node has {have}")


def _whole(node: NodeState, request: GpuRequest) -> list[Assignment] | NoFitReason:
    usable = [g for g in node.gpus if gpu_model_ok(request, g) and not g.partitioned]
    if not usable:
        return _model_reason(node, request) if node.gpus else NoFitReason(2.0, node.name, "node has no GPUs")
    if request.gpu_memory_mib is not None:
        usable = [g for g in usable if g.memory_mib >= request.gpu_memory_mib]
        if not usable:
            return NoFitReason(2.0, node.name, f"no GPU with {request.gpu_memory_mib} MiB memory")
    free = [g for g in usable if g.free_milli == MILLI_PER_GPU]
    if len(free) < request.gpus:
        return NoFitReason(
            _short(request.gpus, len(free)),
            node.name,
            f"needs {request.gpus} free GPUs, {len(free)} free of {len(usable)}",
        )
    taken = tuple(g.index for g in free[: request.gpus])
    memory = min(g.memory_mib for g in free[: request.gpus])
    return [Assignment(node.name, taken, MILLI_PER_GPU, memory)]


def _fraction(node: NodeState, request: GpuRequest) -> list[Assignment] | NoFitReason:
    milli = request.gpu_milli or 0
    usable = [g for g in node.gpus if gpu_model_ok(request, g) and not g.partitioned]
    if not usable:
        return _model_reason(node, request) if node.gpus else NoFitReason(2.0, node.name, "node has no GPUs")
    out = []
    best_free = 0
    for gpu in usable:
        memory = fraction_memory(request, gpu)
        if memory > gpu.memory_mib:
            continue
        best_free = max(best_free, gpu.free_milli)
        if gpu.free_milli >= milli and gpu.free_memory_mib >= memory:
            out.append(Assignment(node.name, (gpu.index,), milli, memory))
    if out:
        return out
    if request.gpu_memory_mib is not None and all(fraction_memory(request, g) > g.memory_mib for g in usable):
        return NoFitReason(2.0, node.name, f"no GPU with {request.gpu_memory_mib} MiB memory")
    return NoFitReason(
        _short(milli, best_free),
        node.name,
        f"needs {milli} milli-GPU on one GPU, the freest GPU has {best_free}",
    )


def _mig(node: NodeState, request: GpuRequest) -> list[Assignment] | NoFitReason:
    profile = str(request.mig_profile)
    milli = MIG_PROFILES[profile].milli
    memory = MIG_PROFILES[profile].memory_gb * 1024
    out = []
    for gpu in node.gpus:
        if not gpu_model_ok(request, gpu):
            continue
        for slice_id, slice_profile in gpu.mig_free:
            if slice_profile == profile:
                out.append(Assignment(node.name, (gpu.index,), milli, memory, mig_slice=slice_id))
                break
    if out:
        return out
    if request.gpu_models and not any(gpu_model_ok(request, g) for g in node.gpus):
        return _model_reason(node, request)
    return NoFitReason(1.0, node.name, f"no free MIG slice {profile}")
