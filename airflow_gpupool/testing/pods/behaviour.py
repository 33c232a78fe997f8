"""What the simulated kubelet does with a pod: set by pod annotations or by test rules.

Annotations (all optional, values are strings as Kubernetes requires):

``gpupool.emulator/duration-seconds``
    how long the containers run (default: the emulator's, 0.5 s)
``gpupool.emulator/exit-code``
    exit code of the containers; 0 gives ``Succeeded``/``Completed``, other codes ``Failed``/``Error``
``gpupool.emulator/oom-killed``
    ``"true"``: the container is killed with reason ``OOMKilled``, exit code 137
``gpupool.emulator/evict``
    ``"true"``: the pod is evicted while running (``status.reason`` ``Evicted``)
``gpupool.emulator/never-schedule``
    ``"true"``: the pod stays ``Pending`` with a ``FailedScheduling`` event
``gpupool.emulator/node-lost``
    ``"true"``: the node stops responding while the pod runs; the pod goes ``Failed`` with reason
    ``NodeLost`` and the node turns ``NotReady`` (``"delete"``: the node disappears)
``gpupool.emulator/image-pull-error``
    ``"true"``: the container waits with ``ErrImagePull`` then ``ImagePullBackOff``
``gpupool.emulator/log-lines``
    the container's log: a JSON list of strings, or text with one line per line
``gpupool.emulator/checkpoint-dir``
    a local path, ``file://`` URL or fsspec URL (``s3://``) where training checkpoints are written
``gpupool.emulator/checkpoint-steps``
    the step the training reaches (``step-000001`` ... ``step-00000N``), then ``COMPLETE``
``gpupool.emulator/fail-after-step``
    crash (exit code 1) right after writing this step, unless the run resumed from it or later
``gpupool.emulator/checkpoint-on-sigterm``
    ``"true"``: the training handles SIGTERM (as ``GPUPOOL_EMULATOR_CHECKPOINT_ON_SIGTERM=1`` in
    its container's env also says): deleted with a grace period while running, it writes one more
    checkpoint step (an emergency checkpoint) within the grace and exits with code 143
``gpupool.emulator/sigterm-exit-seconds``
    how long the containers take to exit after SIGTERM (writing the emergency checkpoint at the
    end of it; default 0); a pod whose grace runs out first is killed without it
``gpupool.emulator/schedule-delay-seconds`` / ``gpupool.emulator/start-delay-seconds``
    time spent unscheduled and then in ``ContainerCreating`` (defaults 0.05 s each)

A rule registered with ``configure_pod`` on the emulator wins over the annotations.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
from collections.abc import Callable, Mapping
from typing import Any

ANNOTATION_PREFIX = "gpupool.emulator/"

PodPredicate = Callable[[Mapping[str, Any]], bool]


@dataclasses.dataclass(frozen=True)
class PodBehaviour:
    """How the simulated kubelet runs one pod; ``None`` fields fall back to the emulator's defaults.

    :param duration_seconds: how long the containers run
    :param exit_code: container exit code
    :param oom_killed: kill the container with ``OOMKilled``
    :param evict: evict the pod while running
    :param never_schedule: keep the pod unschedulable
    :param node_lost: lose the node while the pod runs (``"delete"`` removes the node)
    :param image_pull_error: fail pulling the image
    :param log_lines: the container log
    :param checkpoint_dir: local path, ``file://`` URL or fsspec URL for checkpoints
    :param checkpoint_steps: the last step to write
    :param fail_after_step: crash after writing this step
    :param checkpoint_on_sigterm: write an emergency checkpoint when deleted with a grace period
    :param schedule_delay_seconds: time before the pod is scheduled
    :param start_delay_seconds: time between scheduling and running
    :param sigterm_exit_seconds: time between SIGTERM and the containers' exit
    """

    duration_seconds: float | None = None
    exit_code: int | None = None
    oom_killed: bool | None = None
    evict: bool | None = None
    never_schedule: bool | None = None
    node_lost: bool | str | None = None
    image_pull_error: bool | None = None
    log_lines: tuple[str, ...] | None = None
    checkpoint_dir: str | None = None
    checkpoint_steps: int | None = None
    fail_after_step: int | None = None
    checkpoint_on_sigterm: bool | None = None
    schedule_delay_seconds: float | None = None
    start_delay_seconds: float | None = None
    sigterm_exit_seconds: float | None = None

    def merged(self, override: PodBehaviour) -> PodBehaviour:
        """Return this behaviour with every field that ``override`` sets replaced.

        :param override: the behaviour that wins
        """
        changes = {f.name: getattr(override, f.name) for f in dataclasses.fields(override)}
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def _flag(value: str) -> bool:
    """Read an annotation flag.

    :param value: the annotation value
    """
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _node_lost(value: str) -> bool | str:
    """Read the node-lost annotation (a flag or ``delete``).

    :param value: the annotation value
    """
    return "delete" if value.strip().lower() == "delete" else _flag(value)


def parse_log_lines(value: str) -> tuple[str, ...]:
    """Read log lines from a JSON list or from newline-separated text.

    :param value: the annotation value
    """
    stripped = value.strip()
    if stripped.startswith("["):
        try:
            lines = json.loads(stripped)
        except ValueError:
            lines = None
        if isinstance(lines, list):
            return tuple(str(line) for line in lines)
    return tuple(value.splitlines())


_PARSERS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "duration-seconds": ("duration_seconds", float),
    "exit-code": ("exit_code", int),
    "oom-killed": ("oom_killed", _flag),
    "evict": ("evict", _flag),
    "never-schedule": ("never_schedule", _flag),
    "node-lost": ("node_lost", _node_lost),
    "image-pull-error": ("image_pull_error", _flag),
    "log-lines": ("log_lines", parse_log_lines),
    "checkpoint-dir": ("checkpoint_dir", str),
    "checkpoint-steps": ("checkpoint_steps", int),
    "fail-after-step": ("fail_after_step", int),
    "checkpoint-on-sigterm": ("checkpoint_on_sigterm", _flag),
    "schedule-delay-seconds": ("schedule_delay_seconds", float),
    "sigterm-exit-seconds": ("sigterm_exit_seconds", float),
    "start-delay-seconds": ("start_delay_seconds", float),
}

ANNOTATIONS: tuple[str, ...] = tuple(ANNOTATION_PREFIX + key for key in _PARSERS)


def behaviour_from_annotations(annotations: Mapping[str, str] | None) -> PodBehaviour:
    """Return the behaviour a pod asks for through its ``gpupool.emulator/*`` annotations.

    :param annotations: the pod's annotations
    :raises ValueError: when an annotation value cannot be read
    """
    values: dict[str, Any] = {}
    for key, value in (annotations or {}).items():
        if not key.startswith(ANNOTATION_PREFIX):
            continue
        field, parse = _PARSERS.get(key[len(ANNOTATION_PREFIX) :], (None, str))
        if field is None:
            continue
        try:
            values[field] = parse(str(value))
        except ValueError as e:
            raise ValueError(f"annotation {key}={value!r} cannot be read: {e}") from e
    return PodBehaviour(**values)


@dataclasses.dataclass(frozen=True)
class PodRule:
    """A test rule: pods that match get ``behaviour`` (all given criteria must hold).

    :param behaviour: what to do with matching pods
    :param name: an ``fnmatch`` pattern on the pod name (``train-*``)
    :param labels: labels the pod must carry
    :param namespace: the pod's namespace
    :param predicate: a function of the whole pod dict
    """

    behaviour: PodBehaviour
    name: str | None = None
    labels: Mapping[str, str] | None = None
    namespace: str | None = None
    predicate: PodPredicate | None = None

    def matches(self, pod: Mapping[str, Any]) -> bool:
        """Return whether the rule applies to a pod.

        :param pod: the pod dict
        """
        meta = pod.get("metadata") or {}
        if self.name is not None and not fnmatch.fnmatchcase(meta.get("name", ""), self.name):
            return False
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        pod_labels = meta.get("labels") or {}
        if self.labels and any(pod_labels.get(k) != v for k, v in self.labels.items()):
            return False
        return self.predicate is None or bool(self.predicate(pod))


def resolve_behaviour(pod: Mapping[str, Any], rules: list[PodRule]) -> PodBehaviour:
    """Return the behaviour for a pod: its annotations, then every matching rule in order.

    :param pod: the pod dict
    :param rules: test rules, later ones winning
    """
    behaviour = behaviour_from_annotations((pod.get("metadata") or {}).get("annotations"))
    for rule in rules:
        if rule.matches(pod):
            behaviour = behaviour.merged(rule.behaviour)
    return behaviour
