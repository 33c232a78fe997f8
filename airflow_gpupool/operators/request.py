"""The GPU request of a GpuPodOperator, built from its arguments and ``container_resources``.

Pure and without I/O: it runs when the DAG file is parsed (for arguments that are not templated)
and again after rendering, so a bad request fails the DAG import, not the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_gpupool import quantity, validate
from airflow_gpupool.exceptions import InvalidInventoryError, InvalidRequestError
from airflow_gpupool.resources import GpuRequest

__all__ = [
    "DEFAULT_CPU_MILLI",
    "DEFAULT_MEMORY_MIB",
    "REQUEST_FIELDS",
    "build_request",
    "check_checkpoint_on_sigterm",
    "check_keep_checkpoints",
    "check_log_tail_lines",
    "check_seconds",
    "requested_cpu_milli",
    "requested_memory_mib",
    "shm_mib",
    "templated",
]

#: The operator arguments that make up the GPU request (templated, so checked at run time if templated).
REQUEST_FIELDS = (
    "gpus",
    "gpu_milli",
    "gpu_memory_mib",
    "mig_profile",
    "gpu_models",
    "node_labels",
    "prefer_node_labels",
    "priority",
    "team",
)
_INT_FIELDS = ("gpus", "gpu_milli", "gpu_memory_mib", "priority")
#: What a pod asks for when ``container_resources`` does not say.
DEFAULT_CPU_MILLI = 1000
DEFAULT_MEMORY_MIB = 1024


def templated(value: Any) -> bool:
    """Return whether a value (or anything inside it) is a Jinja template still to be rendered.

    Looks inside mappings, sequences and ``V1ResourceRequirements`` (``container_resources``).
    """
    if hasattr(value, "openapi_types"):
        # A Kubernetes model (V1ResourceRequirements): its fields are what KPO renders.
        return any(templated(getattr(value, name, None)) for name in value.openapi_types)
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, Mapping):
        return any(templated(k) or templated(v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return any(templated(v) for v in value)
    return False


def _requested(container_resources: Any, key: str) -> Any:
    # KPO takes a V1ResourceRequirements or the same as a dict.
    if isinstance(container_resources, Mapping):
        requests = container_resources.get("requests")
    else:
        requests = getattr(container_resources, "requests", None)
    if requests is None:
        return None
    if not isinstance(requests, Mapping):
        raise InvalidRequestError(
            "container_resources.requests", requests, "a mapping such as {'cpu': '2', 'memory': '8Gi'}"
        )
    return requests.get(key)


def requested_cpu_milli(container_resources: Any) -> int:
    """Return the CPU the container requests, in milli-cores (default 1 core).

    :param container_resources: the operator's ``V1ResourceRequirements`` (or None)
    :raises InvalidRequestError: the request is not a CPU quantity
    """
    raw = _requested(container_resources, "cpu")
    if raw is None:
        return DEFAULT_CPU_MILLI
    try:
        return quantity.cpu_milli(raw)
    except ValueError:
        raise InvalidRequestError(
            "container_resources.requests.cpu", raw, "cores (4, 0.5) or milli-cores (500m)"
        ) from None


def requested_memory_mib(container_resources: Any) -> int:
    """Return the memory the container requests, in MiB (default 1 GiB).

    :param container_resources: the operator's ``V1ResourceRequirements`` (or None)
    :raises InvalidInventoryError: the request is not a memory quantity
    """
    raw = _requested(container_resources, "memory")
    if raw is None:
        return DEFAULT_MEMORY_MIB
    try:
        return quantity.memory_mib(raw)
    except ValueError:
        raise InvalidInventoryError(
            "container_resources.requests.memory", raw, "a memory quantity such as 80Gi or 512Mi"
        ) from None


def _integer(name: str, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return int(value.strip())
    except ValueError:
        raise InvalidRequestError(name, value, "an integer (after templating)") from None


def _labels(name: str, value: Any) -> tuple[tuple[str, str], ...]:
    labels = value or {}
    if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
        raise InvalidRequestError(name, labels, "a mapping of label names to strings")
    return tuple(labels.items())


def shm_mib(shm_size: Any) -> int:
    """Return the size of a memory-backed ``/dev/shm`` in MiB (0: none).

    :param shm_size: a memory quantity with a unit (``8Gi``), or None
    :raises InvalidRequestError: not a positive memory quantity with a unit
    """
    if shm_size is None:
        return 0
    expected = "a memory quantity with a unit such as 8Gi or 512Mi (or None)"
    if not isinstance(shm_size, str) or shm_size.strip().replace(".", "", 1).isdigit():
        raise InvalidRequestError("shm_size", shm_size, expected)
    try:
        mib = quantity.memory_mib(shm_size)
    except ValueError:
        raise InvalidRequestError("shm_size", shm_size, expected) from None
    if mib < 1:
        raise InvalidRequestError("shm_size", shm_size, "at least 1Mi")
    return mib


def build_request(
    fields: Mapping[str, Any],
    *,
    workload_class: str,
    preemptible: bool,
    container_resources: Any,
    shm_size: Any = None,
    checkpoint_on_sigterm: bool = False,
) -> GpuRequest:
    """Return the request of the operator's (rendered) arguments.

    :param fields: the values of :data:`REQUEST_FIELDS`, by name
    :param workload_class: ``training``, ``inference`` or ``batch``
    :param preemptible: whether higher-priority work may take the slice back
    :param checkpoint_on_sigterm: the pod writes a checkpoint on SIGTERM within its grace (a
        preemption victim then loses no work; see :func:`check_checkpoint_on_sigterm`)
    :param container_resources: the operator's ``V1ResourceRequirements`` (CPU and memory), or None
    :param shm_size: a memory-backed ``/dev/shm``; its size is counted in the request's memory
        (Kubernetes charges tmpfs pages to the pod's memory)
    :raises InvalidRequestError: a bad field, named in the error's ``field``
    """
    models = fields["gpu_models"]
    if isinstance(models, str):
        models = [m for m in models.replace(",", "|").split("|") if m]
    if models is not None and (
        not isinstance(models, list | tuple | set | frozenset)
        or not all(isinstance(m, str) and m for m in models)
    ):
        raise InvalidRequestError("gpu_models", models, "GPU model names: a list of strings, or 'A100|H100'")
    labels = {name: _labels(name, fields[name]) for name in ("node_labels", "prefer_node_labels")}
    if not isinstance(fields["team"], str) or not fields["team"]:
        raise InvalidRequestError("team", fields["team"], "a team name")
    return GpuRequest(
        cpu_milli=requested_cpu_milli(container_resources),
        memory_mib=requested_memory_mib(container_resources) + shm_mib(shm_size),
        mig_profile=fields["mig_profile"],  # "" is refused by name, never read as "no profile"
        gpu_models=frozenset(models or ()),
        node_labels=labels["node_labels"],
        prefer_node_labels=labels["prefer_node_labels"],
        workload_class=workload_class,  # type: ignore[arg-type]
        team=fields["team"],
        preemptible=preemptible,
        checkpoint_on_sigterm=checkpoint_on_sigterm,
        **{name: _integer(name, fields[name]) for name in _INT_FIELDS},
    )


def check_checkpoint_on_sigterm(value: Any, checkpoint_dir: Any) -> None:
    """Refuse ``checkpoint_on_sigterm`` that is not a bool, or True without a ``checkpoint_dir``.

    A step that promises a checkpoint on SIGTERM needs somewhere to write it; the ledger ranks
    such a preemption victim as losing no work, so a promise it cannot keep is refused early.

    :raises InvalidRequestError: naming ``checkpoint_on_sigterm``
    """
    if not isinstance(value, bool):
        raise InvalidRequestError("checkpoint_on_sigterm", value, "True or False")
    if value and checkpoint_dir is None:
        raise InvalidRequestError(
            "checkpoint_on_sigterm", value, "False without a checkpoint_dir (there is nowhere to write one)"
        )


def check_seconds(name: str, value: Any) -> None:
    """Refuse a duration argument that is not a positive number (None: the configured default).

    :raises InvalidRequestError: naming the argument
    """
    if value is None:
        return
    try:
        # A DAG argument is a number: text and timedeltas, which configuration may use, are refused.
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{value!r} is not a number")
        validate.positive_seconds(value)
    except ValueError:
        raise InvalidRequestError(name, value, "a positive number of seconds") from None


def check_log_tail_lines(value: Any) -> None:
    """Refuse a log tail that is not an integer of at least 1.

    :raises InvalidRequestError: naming ``log_tail_lines``
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequestError("log_tail_lines", value, "an integer of at least 1")


def check_keep_checkpoints(value: Any) -> None:
    """Refuse a checkpoint retention that is not an integer of at least 1 (None: never prune).

    :raises InvalidRequestError: naming ``keep_checkpoints``
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidRequestError("keep_checkpoints", value, "an integer of at least 1, or None")
