"""The compatibility table: each scenario runs through KubernetesPodOperator and GpuPodOperator alike.

A scenario is the operator arguments both get (the emulator's behaviour as pod annotations), the
faults the API server injects, the mode (sync or deferrable), and the final state it must reach;
the suite asserts both operators end the same way (state, exception type and message, XComs,
callbacks, pod deletion, pod spec apart from the pinning).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SCENARIOS", "Scenario"]

SIDECAR = {"name": "sidecar", "image": "registry.example/proxy:1", "args": ["--listen", ":8080"]}


@dataclass(frozen=True)
class Scenario:
    """One row of the table.

    :param name: unique; also the pod's name (``random_name_suffix=False``), so faults can target it
    :param state: the final state both must reach: ``success``, ``skipped``, ``failed`` or ``up_for_retry``
    :param behaviour: emulator annotations (``exit-code``, ``oom-killed``, ``never-schedule``...)
    :param kwargs: further KubernetesPodOperator arguments
    :param deferrable: run deferred (the trigger is run to its event, then the resume method)
    :param faults: ``(method, subresource or "", status)`` the API server answers for this pod
    :param retries: the task's retries (the try is the first)
    :param pod_spec: a full pod spec (dict) given as ``full_pod_spec`` / ``pod_template_dict``
    """

    name: str
    state: str
    behaviour: dict[str, str] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)
    deferrable: bool = False
    faults: tuple[tuple[str, str, int], ...] = ()
    retries: int = 0
    pod_spec: dict[str, Any] | None = None


def _both(name: str, state: str, **kwargs: Any) -> list[Scenario]:
    return [
        Scenario(f"{name}-sync", state, **kwargs),
        Scenario(f"{name}-def", state, deferrable=True, **kwargs),
    ]


_TEMPLATED = {"requests": {"cpu": "{{ params.cpu }}", "memory": "{{ params.memory }}"}}
_SPEC = {
    "metadata": {"labels": {"team": "vision"}, "annotations": {"owner": "ml-platform"}},
    "spec": {
        "containers": [{"name": "base", "image": "registry.example/train:2", "args": ["--epochs", "1"]}]
    },
}
_SPEC_SIDECAR = {
    "metadata": {"labels": {"team": "vision"}},
    "spec": {"containers": [{"name": "base", "image": "registry.example/train:2"}, SIDECAR]},
}

SCENARIOS: list[Scenario] = [
    # -- success ------------------------------------------------------------------------------
    *_both("ok", "success"),
    *_both("ok-logs", "success", behaviour={"log-lines": '["epoch 1", "loss 0.1"]'}),
    *_both("ok-no-logs", "success", kwargs={"get_logs": False}),
    *_both("ok-keep-pod", "success", kwargs={"on_finish_action": "keep_pod"}),
    *_both("ok-delete-succeeded", "success", kwargs={"on_finish_action": "delete_succeeded_pod"}),
    *_both("ok-callbacks", "success", kwargs={"callbacks": "RECORDING"}),
    *_both("ok-grace", "success", kwargs={"termination_grace_period": 7}),
    *_both(
        "ok-resources", "success", kwargs={"container_resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}
    ),
    *_both("ok-templated-resources", "success", kwargs={"container_resources": _TEMPLATED}),
    *_both("ok-env-labels", "success", kwargs={"env_vars": {"EPOCHS": "3"}, "labels": {"app": "train"}}),
    *_both("ok-full-pod-spec", "success", pod_spec=_SPEC),
    *_both("ok-sidecar", "success", pod_spec=_SPEC_SIDECAR),
    Scenario("ok-pod-template-file", "success", kwargs={"pod_template_file": "TEMPLATE"}),
    # -- the pod fails ------------------------------------------------------------------------
    *_both("exit-1", "failed", behaviour={"exit-code": "1"}),
    *_both("exit-1-retried", "up_for_retry", behaviour={"exit-code": "1"}, retries=2),
    *_both(
        "exit-1-no-spec-log",
        "failed",
        behaviour={"exit-code": "1"},
        kwargs={"log_pod_spec_on_failure": False},
    ),
    *_both("oom-killed", "failed", behaviour={"oom-killed": "true"}),
    *_both("evicted", "failed", behaviour={"evict": "true", "duration-seconds": "2"}),
    *_both("node-lost", "failed", behaviour={"node-lost": "true", "duration-seconds": "2"}),
    *_both(
        "exit-1-keep-pod", "failed", behaviour={"exit-code": "1"}, kwargs={"on_finish_action": "keep_pod"}
    ),
    *_both(
        "exit-1-delete-succeeded",
        "failed",
        behaviour={"exit-code": "1"},
        kwargs={"on_finish_action": "delete_succeeded_pod"},
    ),
    *_both("exit-1-callbacks", "failed", behaviour={"exit-code": "1"}, kwargs={"callbacks": "RECORDING"}),
    *_both("exit-1-events", "failed", behaviour={"exit-code": "1"}, kwargs={"log_events_on_failure": True}),
    *_both("exit-1-sidecar", "failed", behaviour={"exit-code": "1"}, pod_spec=_SPEC_SIDECAR),
    # -- skip_on_exit_code --------------------------------------------------------------------
    *_both("skip-exit-3", "skipped", behaviour={"exit-code": "3"}, kwargs={"skip_on_exit_code": 3}),
    *_both("skip-other-code", "failed", behaviour={"exit-code": "1"}, kwargs={"skip_on_exit_code": [3, 4]}),
    # -- the launch fails ---------------------------------------------------------------------
    *_both(
        "launch-timeout",
        "failed",
        behaviour={"never-schedule": "true"},
        kwargs={"startup_timeout_seconds": 2},
    ),
    *_both(
        "image-pull-error",
        "failed",
        behaviour={"image-pull-error": "true"},
        kwargs={"startup_timeout_seconds": 3},
    ),
    # -- do_xcom_push: the emulator has no exec, so reading the sidecar's result fails alike
    *_both("xcom-push", "failed", kwargs={"do_xcom_push": True}),
    # -- the API server fails -----------------------------------------------------------------
    Scenario("api-500-delete", "success", faults=(("delete", "", 500),)),
    Scenario("api-500-read", "failed", faults=(("get", "", 500),)),
    Scenario("pod-not-found", "failed", faults=(("get", "", 404),)),
    Scenario("api-500-log", "success", faults=(("get", "log", 500),)),
]
