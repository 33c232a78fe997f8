"""Airflow's ``pod_mutation_hook`` for pods that ``GpuPodOperator`` did not build.

Airflow applies ``pod_mutation_hook`` to every pod ``KubernetesPodOperator`` builds and to every
KubernetesExecutor worker pod. Installed in ``airflow_local_settings.py``::

    from airflow_gpupool.executor_hook import pod_mutation_hook  # noqa: F401

or, beside a hook of your own (ours last, so it sees the GPUs yours may add)::

    from airflow_gpupool.executor_hook import compose, pod_mutation_hook as gpupool_hook
    pod_mutation_hook = compose(my_team_hook, gpupool_hook)

each pod that asks for GPUs (``nvidia.com/gpu``, ``nvidia.com/mig-<profile>``, or a
``gpupool.io/request`` annotation for a fraction) gets the scheduling gate
``gpupool.io/reservation`` and annotations carrying its request, its binding and the Airflow
identity of its task try. The kube-scheduler leaves a gated pod alone; the gatekeeper of
``gpupool controller run`` (:mod:`airflow_gpupool.controller.gatekeeper`) reserves the request in
the ledger, pins the pod to the granted node and removes the gate. Pods ``GpuPodOperator`` built
(they carry ``gpupool.io/reservation-id``: they already hold a grant) and pods without GPUs are
left as they are. Priority is the pod's ``gpupool.io/priority`` label or annotation, else its
``spec.priorityClassName``'s value (marked ``gpupool.io/priority-class``, resolved by the
gatekeeper); ``gpupool.io/checkpoint-on-sigterm: "true"`` is ``checkpoint_on_sigterm``
(:mod:`airflow_gpupool.pod_options`).

A pod's resources and environment cannot change once it exists, so the binding is chosen here,
from what the pod itself asks for: ``whole`` (``nvidia.com/gpu: n``), ``mig``
(``nvidia.com/mig-<profile>: 1``) or ``hami`` (a fraction, with the pod's own ``nvidia.com/gpumem``
or ``nvidia.com/gpucores``). Anything else (a fraction with no sharing resource, a request
annotation that contradicts the pod's resources, a malformed annotation) is marked ``refused``
with the reason: the gatekeeper records it in a pod event and deletes the pod, so the task fails
with that reason. The hook itself never raises: a hook error would fail every pod of the cluster.

This module imports nothing from Airflow when it is imported (what may, is imported by the
functions that use it): Airflow imports ``airflow_local_settings`` while it is itself being
imported, which may be from inside this package (``gpupool controller run`` on an Airflow image).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_gpupool.labels import (
    BINDING_ANNOTATION,
    DAG_ID_ANNOTATION,
    GPU_RESOURCE,
    HAMI_CORES_RESOURCE,
    HAMI_MEMORY_RESOURCE,
    MAP_INDEX_ANNOTATION,
    MIG_RESOURCE_PREFIX,
    PRIORITY_CLASS_ANNOTATION,
    PRIORITY_KEY,
    PRODUCT_LABEL,
    REQUEST_ANNOTATION,
    RESERVATION_LABEL,
    RUN_ID_ANNOTATION,
    SCHEDULING_GATE,
    TASK_ID_ANNOTATION,
    TEAM_KEY,
    TRY_NUMBER_ANNOTATION,
)
from airflow_gpupool.quantity import cpu_milli, memory_mib, parse_quantity
from airflow_gpupool.task_try import TaskTry

if TYPE_CHECKING:
    from airflow_gpupool.resources import GpuRequest

__all__ = [
    "GATEKEEPER_HOST",
    "REFUSED",
    "GateDecision",
    "compose",
    "decide",
    "gated_request",
    "identity_from_annotations",
    "identity_from_pod",
    "pod_mutation_hook",
]

log = logging.getLogger(__name__)

#: The binding of a pod the gatekeeper must refuse; ``gpupool.io/binding: refused: <reason>``.
REFUSED = "refused"
#: The host part of the holders of gated pods' reservations: how the gatekeeper tells its own apart.
GATEKEEPER_HOST = "gatekeeper"
#: Where Airflow writes the identity of a task try on the pods it launches (KubernetesExecutor
#: writes the raw values as annotations, both write label-safe values as labels).
_AIRFLOW_KEYS = {"dag_id": "dag_id", "task_id": "task_id", "run_id": "run_id"}


@dataclass(frozen=True)
class GateDecision:
    """What the hook does to one pod (pure: :func:`decide`).

    :param gate: whether the pod is gated (False: left untouched)
    :param annotations: the annotations to add
    """

    gate: bool
    annotations: Mapping[str, str]


def _resources(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Return the summed resources of the pod's containers (a limit counts as a request when none is set)."""
    total: dict[str, Any] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for key, value in merged.items():
            total[key] = parse_quantity(value) + total.get(key, 0)
    return total


def _meta(pod: Mapping[str, Any], part: str) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get(part) or {})


def identity_from_pod(pod: Mapping[str, Any], context: Mapping[str, Any] | None = None) -> TaskTry | None:
    """Return the task try a pod runs, from Airflow's annotations, the running task or its labels.

    KubernetesExecutor annotates its worker pods with the raw ids; KubernetesPodOperator only
    labels them, with label-safe (possibly shortened) values, so the running task's own context,
    when the hook runs inside it, is read before the labels.

    :param pod: the pod, as a JSON dict
    :param context: the Airflow context of the task building the pod, if any
    """
    annotations, labels = _meta(pod, "annotations"), _meta(pod, "labels")
    ti = (context or {}).get("ti")
    for source in (annotations, _context_ids(ti, labels), labels):
        if all(source.get(k) for k in _AIRFLOW_KEYS):
            try:
                return TaskTry(
                    dag_id=source["dag_id"],
                    task_id=source["task_id"],
                    run_id=source["run_id"],
                    map_index=int(source.get("map_index") or -1),
                    try_number=int(source.get("try_number") or 1),
                    host=GATEKEEPER_HOST,
                )
            except ValueError:
                continue
    return None


def identity_from_annotations(annotations: Mapping[str, str]) -> TaskTry | None:
    """Return the task try the hook wrote on a gated pod (``gpupool.io/dag-id`` ...), or None.

    :param annotations: the pod's annotations
    """
    try:
        return TaskTry(
            dag_id=annotations[DAG_ID_ANNOTATION],
            task_id=annotations[TASK_ID_ANNOTATION],
            run_id=annotations[RUN_ID_ANNOTATION],
            map_index=int(annotations.get(MAP_INDEX_ANNOTATION) or -1),
            try_number=int(annotations.get(TRY_NUMBER_ANNOTATION) or 1),
            host=GATEKEEPER_HOST,
        )
    except (KeyError, ValueError):
        return None


def _context_ids(ti: Any, labels: Mapping[str, str]) -> dict[str, str]:
    """Return the running task's ids when they are the pod's (its labels name the same task)."""
    if ti is None or labels.get("task_id") != getattr(ti, "task_id", None):
        return {}
    return {
        "dag_id": str(ti.dag_id),
        "task_id": str(ti.task_id),
        "run_id": str(ti.run_id),
        "map_index": str(getattr(ti, "map_index", -1)),
        "try_number": str(getattr(ti, "try_number", 1)),
    }


def _from_resources(res: Mapping[str, Any]) -> dict[str, Any]:
    """Return the GPU part of a request from the pod's device-plugin resources."""
    migs = sorted(k for k in res if k.startswith(MIG_RESOURCE_PREFIX) and res[k] > 0)
    if migs:
        return {"mig_profile": migs[0][len(MIG_RESOURCE_PREFIX) :]}
    gpus = int(res.get(GPU_RESOURCE, 0))
    return {"gpus": gpus} if gpus else {}


def gated_request(pod: Mapping[str, Any]) -> tuple[GpuRequest, str] | None:
    """Return the request of a GPU pod and its binding, or None when the pod asks for no GPU.

    :param pod: the pod, as a JSON dict
    :raises InvalidRequestError: the request annotation is malformed, or the pod asks for something
        its own resources cannot carry (the binding is then refused)
    """
    from airflow_gpupool.exceptions import InvalidRequestError
    from airflow_gpupool.pod_gang import pod_gang
    from airflow_gpupool.pod_options import check_sigterm_promise, sigterm_promise
    from airflow_gpupool.resources import GpuRequest

    annotations, labels = _meta(pod, "annotations"), _meta(pod, "labels")
    res = _resources(pod)
    gpu_part = _from_resources(res)
    asked = annotations.get(REQUEST_ANNOTATION)
    if not gpu_part and not asked:
        return None
    values: dict[str, Any] = {
        "cpu_milli": cpu_milli(str(res.get("cpu", 0))),
        "memory_mib": memory_mib(str(res.get("memory", 0))),
        **gpu_part,
    }
    team = labels.get(TEAM_KEY) or annotations.get(TEAM_KEY)
    if team:
        values["team"] = team
    priority = labels.get(PRIORITY_KEY) or annotations.get(PRIORITY_KEY)
    if priority:
        try:
            values["priority"] = int(priority)
        except ValueError:
            raise InvalidRequestError(PRIORITY_KEY, priority, "an integer") from None
    promise = sigterm_promise(pod)
    if promise is not None:
        values["checkpoint_on_sigterm"] = promise
    if asked:
        values = _with_placement(_parse_annotation(asked), values)
    values = _with_placement(node_selection(pod), values)
    _refuse_dra(pod, annotations)
    pod_gang(annotations)  # a malformed pod group refuses the pod, as a malformed request does
    request = GpuRequest.from_dict(values)
    check_sigterm_promise(request.checkpoint_on_sigterm, pod)
    return request, _binding(request, res)


_DRA_ONLY_THERE = (
    "no resource claims on a gated pod: the dra binding is only on the GpuPodOperator path (a pod's "
    "resource claims cannot change after it is created, so the gatekeeper cannot point one at the "
    "granted device); use GpuPodOperator(binding='dra')"
)


def _refuse_dra(pod: Mapping[str, Any], annotations: Mapping[str, str]) -> None:
    """Refuse a GPU pod that claims devices through DRA, or asks for the ``dra`` binding itself."""
    from airflow_gpupool.exceptions import InvalidRequestError

    claims = [c.get("name") for c in (pod.get("spec") or {}).get("resourceClaims") or []]
    if claims:
        raise InvalidRequestError("spec.resourceClaims", claims, _DRA_ONLY_THERE)
    if annotations.get(BINDING_ANNOTATION) == "dra":
        raise InvalidRequestError(BINDING_ANNOTATION, "dra", _DRA_ONLY_THERE)


_REQUIRED_TERMS = (
    "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
)


def node_selection(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Return the request's placement fields that say where the pod itself can be scheduled.

    ``spec.nodeSelector`` and the required node affinity become ``node_labels`` (all must match)
    and, for ``nvidia.com/gpu.product``, ``gpu_models``; single-value preferred terms become
    ``prefer_node_labels`` (other preferences are soft: ignored). So the gatekeeper never grants a
    node the kube-scheduler would then refuse the pod.

    :param pod: the pod, as a JSON dict
    :raises InvalidRequestError: a required term the ledger cannot express (several terms, an
        operator other than ``In``, ``In`` with several values on a label other than the GPU
        product, ``matchFields``), or constraints no node can satisfy together
    """
    from airflow_gpupool.exceptions import InvalidRequestError

    spec = pod.get("spec") or {}
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    selector = {"node_labels": {k: str(v) for k, v in (spec.get("nodeSelector") or {}).items()}}
    found = _with_placement(_required_affinity(affinity), selector)
    labels: dict[str, str] = found.get("node_labels") or {}
    out: dict[str, Any] = {}
    if PRODUCT_LABEL in labels:
        product = labels.pop(PRODUCT_LABEL)
        if found.get("gpu_models") and product not in found["gpu_models"]:
            raise InvalidRequestError(
                PRODUCT_LABEL, product, f"one of {found['gpu_models']}, as the pod also asks"
            )
        found["gpu_models"] = [product]
    if found.get("gpu_models"):
        out["gpu_models"] = sorted(found["gpu_models"])
    if labels:
        out["node_labels"] = labels
    preferred = {
        str(e.get("key")): str(e["values"][0])
        for term in affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
        for e in (term.get("preference") or {}).get("matchExpressions") or []
        if e.get("operator") == "In" and len(e.get("values") or []) == 1
    }
    if preferred:
        out["prefer_node_labels"] = preferred
    return out


def _required_affinity(affinity: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``node_labels`` and ``gpu_models`` from the required node affinity (see :func:`node_selection`)."""
    from airflow_gpupool.exceptions import InvalidRequestError

    terms = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
        "nodeSelectorTerms"
    ) or []
    allowed = f"one term of In expressions, each with one value (several only on {PRODUCT_LABEL})"
    if len(terms) > 1:
        raise InvalidRequestError(_REQUIRED_TERMS, f"{len(terms)} alternative terms", allowed)
    out: dict[str, Any] = {}
    for term in terms:
        if term.get("matchFields"):
            raise InvalidRequestError(f"{_REQUIRED_TERMS}[0].matchFields", term["matchFields"], allowed)
        for expr in term.get("matchExpressions") or []:
            key, values = expr.get("key"), [str(v) for v in expr.get("values") or []]
            if expr.get("operator") != "In" or not values or (len(values) > 1 and key != PRODUCT_LABEL):
                raise InvalidRequestError(f"{_REQUIRED_TERMS}[0].matchExpressions", expr, allowed)
            found = {"gpu_models": values} if key == PRODUCT_LABEL else {"node_labels": {key: values[0]}}
            out = _with_placement(found, out)
    return out


def _with_placement(values: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``base`` updated with ``values``, where both must hold: labels merged, models intersected.

    :raises InvalidRequestError: the two ask for different values of a label, or share no model
    """
    from airflow_gpupool.exceptions import InvalidRequestError

    out = {**base, **values}
    mine, theirs = dict(base.get("node_labels") or {}), dict(values.get("node_labels") or {})
    for key in mine.keys() & theirs.keys():
        if mine[key] != theirs[key]:
            raise InvalidRequestError(
                f"node_labels[{key!r}]", theirs[key], f"{mine[key]!r}, as the pod also asks"
            )
    if mine or theirs:
        out["node_labels"] = {**mine, **theirs}
    if base.get("gpu_models") and values.get("gpu_models"):
        both = set(base["gpu_models"]) & set(values["gpu_models"])
        if not both:
            raise InvalidRequestError(
                "gpu_models", sorted(values["gpu_models"]), f"one of {sorted(base['gpu_models'])}"
            )
        out["gpu_models"] = sorted(both)
    return out


def _parse_annotation(text: str) -> dict[str, Any]:
    from airflow_gpupool.exceptions import InvalidRequestError

    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise InvalidRequestError(REQUEST_ANNOTATION, text, 'a JSON object such as {"gpu_milli": 500}')
    return data


def _binding(request: GpuRequest, res: Mapping[str, Any]) -> str:
    """Return the binding that carries ``request`` with the pod's own resources.

    :raises InvalidRequestError: none can (resources cannot change after the pod is created)
    """
    from airflow_gpupool.exceptions import InvalidRequestError

    gpus = int(res.get(GPU_RESOURCE, 0))
    if request.mig_profile:
        if res.get(MIG_RESOURCE_PREFIX + request.mig_profile, 0) == 1:
            return "mig"
        raise InvalidRequestError(
            "mig_profile",
            request.mig_profile,
            f"the pod's own limit {MIG_RESOURCE_PREFIX}{request.mig_profile}: 1",
        )
    if request.gpu_milli is not None:
        if gpus == 1 and (HAMI_MEMORY_RESOURCE in res or HAMI_CORES_RESOURCE in res):
            return "hami"
        raise InvalidRequestError(
            "gpu_milli",
            request.gpu_milli,
            f"a pod that shares its GPU itself ({GPU_RESOURCE}: 1 with {HAMI_MEMORY_RESOURCE} or "
            f"{HAMI_CORES_RESOURCE}); resources cannot be added to a pod after it is created, "
            "use GpuPodOperator for other fractions",
        )
    if request.gpus == gpus:
        return "whole"
    raise InvalidRequestError("gpus", request.gpus, f"the pod's own {GPU_RESOURCE} limit ({gpus})")


def decide(pod: Mapping[str, Any], context: Mapping[str, Any] | None = None) -> GateDecision:
    """Return what the hook does to a pod (pure: no I/O).

    :param pod: the pod, as a JSON dict
    :param context: the Airflow context of the task building the pod, if any
    """
    from airflow_gpupool.pod_options import priority_class_of

    annotations, labels = _meta(pod, "annotations"), _meta(pod, "labels")
    if RESERVATION_LABEL in labels or RESERVATION_LABEL in annotations:
        return GateDecision(False, {})  # GpuPodOperator's: it holds a grant already
    try:
        found = gated_request(pod)
    except ValueError as e:  # InvalidRequestError is one
        out = {BINDING_ANNOTATION: f"{REFUSED}: {e}"}
    else:
        if found is None:
            return GateDecision(False, {})
        request, binding = found
        out = {
            REQUEST_ANNOTATION: json.dumps(request.to_dict(), sort_keys=True, separators=(",", ":")),
            BINDING_ANNOTATION: binding,
            TEAM_KEY: request.team,
        }
        asked = annotations.get(REQUEST_ANNOTATION)
        priority_class = priority_class_of(pod, _parse_annotation(asked) if asked else {})
        if priority_class is None:
            out[PRIORITY_KEY] = str(request.priority)
        else:  # the gatekeeper reads the class's value: the hook cannot read the cluster
            out[PRIORITY_CLASS_ANNOTATION] = priority_class
    who = identity_from_pod(pod, context)
    if who is not None:
        out |= {
            DAG_ID_ANNOTATION: who.dag_id,
            TASK_ID_ANNOTATION: who.task_id,
            RUN_ID_ANNOTATION: who.run_id,
            TRY_NUMBER_ANNOTATION: str(who.try_number),
            MAP_INDEX_ANNOTATION: str(who.map_index),
        }
    return GateDecision(True, out)


def _current_context() -> Mapping[str, Any] | None:
    """Return the running task's context when the hook runs inside a task (KPO), else None."""
    try:
        from airflow.sdk import get_current_context

        return get_current_context()
    except Exception:  # the scheduler (KubernetesExecutor), or no Airflow at all
        return None


def pod_mutation_hook(pod: Any) -> None:
    """Gate a GPU pod for the gatekeeper (Airflow's ``pod_mutation_hook``; changes ``pod`` in place).

    :param pod: a ``kubernetes.client.V1Pod``
    """
    from kubernetes.client import ApiClient
    from kubernetes.client import models as k8s

    try:
        decision = decide(ApiClient().sanitize_for_serialization(pod), _current_context())
    except Exception as e:  # never fail a pod for the hook's sake: it goes ungated, logged
        log.error("gpupool pod_mutation_hook could not read pod %s: %s", _pod_name(pod), e)
        return
    if not decision.gate:
        return
    pod.metadata = pod.metadata or k8s.V1ObjectMeta()
    pod.metadata.annotations = {**(pod.metadata.annotations or {}), **decision.annotations}
    gates = list(pod.spec.scheduling_gates or [])
    if not any(g.name == SCHEDULING_GATE for g in gates):
        gates.append(k8s.V1PodSchedulingGate(name=SCHEDULING_GATE))
    pod.spec.scheduling_gates = gates


def _pod_name(pod: Any) -> str:
    return str(getattr(getattr(pod, "metadata", None), "name", "?"))


def compose(*hooks: Callable[[Any], Any]) -> Callable[[Any], None]:
    """Return one ``pod_mutation_hook`` that calls ``hooks`` in order on the same pod.

    Put :func:`pod_mutation_hook` last, so it sees the GPUs the hooks before it add.

    :param hooks: functions taking a pod and changing it in place
    """

    def pod_mutation_hook(pod: Any) -> None:
        for hook in hooks:
            hook(pod)

    return pod_mutation_hook
