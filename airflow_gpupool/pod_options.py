"""A gated pod's own gpupool options beside its request, read and checked (pure).

* **Priority from a PriorityClass.** A pod that names ``spec.priorityClassName`` and sets no gpupool
  priority (no ``gpupool.io/priority`` label or annotation, no ``priority`` in its
  ``gpupool.io/request``) takes its priority from that class: the executor hook marks it
  ``gpupool.io/priority-class: <name>`` (:func:`priority_class_of`) and the gatekeeper, which
  can read the cluster, resolves the class's value (:mod:`airflow_gpupool.controller.priority_classes`).
  A gpupool priority the pod sets itself wins: it says what the pod wants of this pool.
* **A checkpoint on SIGTERM.** ``gpupool.io/checkpoint-on-sigterm: "true"`` (a label or an
  annotation) is ``GpuPodOperator(checkpoint_on_sigterm=True)`` for a pod the operator did not
  build. The operator refuses it without a ``checkpoint_dir``; here the pod must tell a container
  where to write (``GPUPOOL_CHECKPOINT_DIR``, :func:`checkpointed`, the rule the spot capacity
  reads too), else :func:`check_sigterm_promise` refuses it.

Below both the executor hook and the controller, so both read a pod alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.labels import (
    CHECKPOINT_DIR_ENV,
    CHECKPOINT_ON_SIGTERM_KEY,
    PRIORITY_CLASS_ANNOTATION,
    PRIORITY_KEY,
)

__all__ = ["check_sigterm_promise", "checkpointed", "priority_class_of", "sigterm_promise"]

_FLAGS = {"true": True, "false": False}


def _meta(pod: Mapping[str, Any], part: str) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get(part) or {}


def priority_class_of(pod: Mapping[str, Any], asked: Mapping[str, Any]) -> str | None:
    """Return the PriorityClass a GPU pod's priority comes from, or None (its own gpupool priority or none).

    A pod the hook gated before (it carries the mark for the class it still names) keeps that
    verdict: the priority the hook wrote on it then is not the pod's own.

    :param pod: the pod, as a JSON dict
    :param asked: its ``gpupool.io/request`` annotation, parsed (empty when it has none)
    """
    name = (pod.get("spec") or {}).get("priorityClassName")
    if not name:
        return None
    annotations = _meta(pod, "annotations")
    if annotations.get(PRIORITY_CLASS_ANNOTATION) == name:
        return str(name)
    own = PRIORITY_KEY in _meta(pod, "labels") or PRIORITY_KEY in annotations or "priority" in asked
    return None if own else str(name)


def sigterm_promise(pod: Mapping[str, Any]) -> bool | None:
    """Return what a pod's ``gpupool.io/checkpoint-on-sigterm`` label or annotation says (None: nothing).

    :param pod: the pod, as a JSON dict
    :raises InvalidRequestError: neither ``true`` nor ``false``
    """
    text = _meta(pod, "labels").get(CHECKPOINT_ON_SIGTERM_KEY) or _meta(pod, "annotations").get(
        CHECKPOINT_ON_SIGTERM_KEY
    )
    if text is None:
        return None
    try:
        return _FLAGS[str(text).strip().lower()]
    except KeyError:
        raise InvalidRequestError(CHECKPOINT_ON_SIGTERM_KEY, text, "true or false") from None


def checkpointed(pod: Mapping[str, Any]) -> bool:
    """Return whether a pod's container is told where to write checkpoints (``GPUPOOL_CHECKPOINT_DIR``).

    :param pod: the pod, as a JSON dict
    """
    containers = (pod.get("spec") or {}).get("containers") or []
    return any(
        env.get("name") == CHECKPOINT_DIR_ENV and (env.get("value") or env.get("valueFrom"))
        for container in containers
        for env in container.get("env") or []
    )


def check_sigterm_promise(promised: bool, pod: Mapping[str, Any]) -> None:
    """Refuse a promise to checkpoint on SIGTERM from a pod with nowhere to write the checkpoint.

    :param promised: the request's ``checkpoint_on_sigterm``
    :param pod: the pod, as a JSON dict
    :raises InvalidRequestError: naming ``checkpoint_on_sigterm``
    """
    if promised and not checkpointed(pod):
        raise InvalidRequestError(
            "checkpoint_on_sigterm",
            True,
            f"false on a pod none of whose containers sets {CHECKPOINT_DIR_ENV} (there is nowhere to "
            "write one; the same rule as GpuPodOperator's checkpoint_dir)",
        )
