"""What the Job controller writes, as pure functions on the JSON the API stores (batch/v1 Jobs).

:func:`prepare_new_job` fills what the API server defaults on a created Job (selector, template
labels, ``backoffLimit``...), :func:`pod_for` makes one pod of a Job as the controller does
(owner reference, ``job-name`` and ``controller-uid`` labels; for ``completionMode: Indexed`` the
completion index as annotation, label and ``JOB_COMPLETION_INDEX``, and the hostname
``<job>-<index>``), and :func:`job_status` computes a Job's ``status`` from what its pods did.
:mod:`~airflow_gpupool.testing.cluster.jobs` runs them on the emulator's loop.
"""

from __future__ import annotations

import copy
import dataclasses
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "COMPLETION_INDEX",
    "CONTROLLER_UID",
    "JOB_NAME",
    "LEGACY_CONTROLLER_UID",
    "LEGACY_JOB_NAME",
    "JobProgress",
    "completion_index",
    "compress_indexes",
    "is_finished",
    "job_status",
    "pod_for",
    "prepare_new_job",
    "wanted_indexes",
]

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOB_NAME = "batch.kubernetes.io/job-name"
CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
LEGACY_JOB_NAME = "job-name"
LEGACY_CONTROLLER_UID = "controller-uid"
INDEX_ENV = "JOB_COMPLETION_INDEX"
DEFAULT_BACKOFF_LIMIT = 6
TERMINAL = ("Succeeded", "Failed")


def prepare_new_job(job: dict[str, Any]) -> None:
    """Fill what the API server sets on a new Job: spec defaults, selector and template labels, empty status.

    :param job: the Job being created (already stamped with a uid), changed in place
    """
    meta, spec = job["metadata"], job.setdefault("spec", {})
    uid, name = meta["uid"], meta["name"]
    spec.setdefault("parallelism", 1)
    if spec.get("completions") is None and spec.get("completionMode") == "Indexed":
        spec["completions"] = 1  # the API server refuses an Indexed Job without completions; be lenient
    spec.setdefault("backoffLimit", DEFAULT_BACKOFF_LIMIT)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    template = spec.setdefault("template", {})
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    owned = {CONTROLLER_UID: uid, JOB_NAME: name, LEGACY_CONTROLLER_UID: uid, LEGACY_JOB_NAME: name}
    labels.update(owned)
    if not spec.get("manualSelector"):
        spec["selector"] = {"matchLabels": {CONTROLLER_UID: uid}}
    if not meta.get("labels"):  # an unlabelled Job takes its template's labels
        meta["labels"] = dict(labels)
    job["status"] = {}


def completion_index(pod: Mapping[str, Any]) -> int | None:
    """Return a pod's completion index, or ``None`` if it has none (a NonIndexed Job's pod).

    :param pod: the pod
    """
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(COMPLETION_INDEX)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def pod_for(job: Mapping[str, Any], index: int | None) -> dict[str, Any]:
    """Return a new pod of a Job, as the Job controller creates it.

    :param job: the Job
    :param index: the completion index (Indexed Jobs), ``None`` otherwise
    """
    meta = job["metadata"]
    template = copy.deepcopy(job["spec"].get("template") or {})
    pod_meta = template.get("metadata") or {}
    name = meta["name"]
    prefix = f"{name}-{index}-" if index is not None else f"{name}-"
    pod_meta.pop("name", None)
    pod_meta.update(
        name=prefix + uuid.uuid4().hex[:5],
        generateName=prefix,
        namespace=meta.get("namespace"),
        ownerReferences=[
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": name,
                "uid": meta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    )
    spec = template.get("spec") or {}
    if index is not None:
        pod_meta.setdefault("annotations", {})[COMPLETION_INDEX] = str(index)
        pod_meta.setdefault("labels", {})[COMPLETION_INDEX] = str(index)
        spec["hostname"] = f"{name}-{index}"
        index_ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
        for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            env = container.setdefault("env", [])
            if not any(e.get("name") == INDEX_ENV for e in env):
                env.append({"name": INDEX_ENV, "valueFrom": index_ref})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}


@dataclasses.dataclass
class JobProgress:
    """What a Job's pods did, counted once per pod even after the pod is deleted.

    :param succeeded: pods that ended ``Succeeded``, by uid, with their completion index
    :param failed: pods that ended ``Failed``, by uid
    """

    succeeded: dict[str, int | None] = dataclasses.field(default_factory=dict)
    failed: set[str] = dataclasses.field(default_factory=set)

    def record(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Count the pods that ended.

        :param pods: the Job's live pods
        """
        for pod in pods:
            uid, phase = pod["metadata"]["uid"], (pod.get("status") or {}).get("phase")
            if phase == "Succeeded":
                self.succeeded[uid] = completion_index(pod)
            elif phase == "Failed":
                self.failed.add(uid)

    def succeeded_indexes(self) -> set[int]:
        """Return the completion indexes with a succeeded pod."""
        return {i for i in self.succeeded.values() if i is not None}

    def succeeded_count(self, indexed: bool) -> int:
        """Return how many completions succeeded (distinct indexes for an Indexed Job).

        :param indexed: whether the Job is Indexed
        """
        return len(self.succeeded_indexes()) if indexed else len(self.succeeded)


def compress_indexes(indexes: Iterable[int]) -> str:
    """Return indexes as ``status.completedIndexes`` writes them: ``"0-2,5"``.

    :param indexes: the indexes
    """
    ranges: list[list[int]] = []
    for i in sorted(set(indexes)):
        if ranges and ranges[-1][1] == i - 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def is_finished(job: Mapping[str, Any]) -> bool:
    """Return whether a Job has a true ``Complete`` or ``Failed`` condition.

    :param job: the Job
    """
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions)


def job_status(
    job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], progress: JobProgress, now: str
) -> tuple[dict[str, Any], str | None]:
    """Return a Job's new status and, when it just ended, ``"Complete"`` or ``"Failed"``.

    :param job: the Job
    :param pods: its live pods
    :param progress: what its pods did
    :param now: the current time, as Kubernetes writes it
    """
    spec, status = job["spec"], copy.deepcopy(job.get("status") or {})
    indexed = spec.get("completionMode") == "Indexed"
    active = [p for p in pods if (p.get("status") or {}).get("phase") not in TERMINAL]
    succeeded = progress.succeeded_count(indexed)
    status.update(
        active=len(active),
        succeeded=succeeded,
        failed=len(progress.failed),
        ready=sum(1 for p in active if (p.get("status") or {}).get("phase") == "Running"),
        terminating=0,
        uncountedTerminatedPods={},
    )
    if not spec.get("suspend"):
        status.setdefault("startTime", now)
    if indexed:
        status["completedIndexes"] = compress_indexes(progress.succeeded_indexes())
    if is_finished(job):
        return status, None
    ended, reason, message = None, "", ""
    if len(progress.failed) > int(spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT)):
        ended, reason, message = (
            "Failed",
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
        )
    elif _complete(spec, succeeded, progress, active):
        ended, reason, message = "Complete", "CompletionsReached", "Reached expected number of succeeded pods"
    if ended is not None:
        condition = {
            "type": ended,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastProbeTime": now,
            "lastTransitionTime": now,
        }
        status["conditions"] = [*(status.get("conditions") or []), condition]
        if ended == "Complete":
            status["completionTime"] = now
    return status, ended


def _complete(spec: Mapping[str, Any], succeeded: int, progress: JobProgress, active: Sequence[Any]) -> bool:
    """Return whether a Job reached its completions.

    :param spec: the Job's spec
    :param succeeded: completions counted
    :param progress: what its pods did
    :param active: its pods still running
    """
    completions = spec.get("completions")
    if completions is None:  # a work queue: done once one pod succeeded and none runs
        return bool(progress.succeeded) and not active
    return succeeded >= int(completions)


def wanted_indexes(
    job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], progress: JobProgress
) -> list[int | None]:
    """Return the pods to create now: completion indexes for an Indexed Job, ``None`` per pod otherwise.

    :param job: the Job (not finished, not suspended)
    :param pods: its live pods
    :param progress: what its pods did
    """
    spec = job["spec"]
    active = [p for p in pods if (p.get("status") or {}).get("phase") not in TERMINAL]
    room = int(spec.get("parallelism", 1)) - len(active)
    if room <= 0:
        return []
    completions = spec.get("completions")
    if spec.get("completionMode") == "Indexed":
        busy = progress.succeeded_indexes() | {completion_index(p) for p in active}
        free: list[int | None] = [i for i in range(int(completions)) if i not in busy]
        return free[:room]
    if completions is None:
        return [] if progress.succeeded else [None] * room
    missing = int(completions) - len(progress.succeeded) - len(active)
    return [None] * max(0, min(room, missing))
