"""EscalationNotifier: tell a person that retrying a GPU task will not help."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseNotifier

from airflow_gpupool.task_try import TaskTry

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = [
    "ESCALATION_KEY",
    "MESSAGE_KEY",
    "Escalation",
    "EscalationNotifier",
    "TriedAttempt",
    "format_escalation",
    "notify_escalation",
]

#: The context key under which the escalation (:meth:`Escalation.to_dict`, primitives) reaches notifiers.
ESCALATION_KEY = "gpupool_escalation"
#: The context key of the rendered text, for notifiers that template a message (Slack, email).
MESSAGE_KEY = "gpupool_escalation_message"


@dataclass(frozen=True)
class TriedAttempt:
    """One earlier failed try, as an escalation reports it.

    :param request: the request it ran with, described (``0.25 GPU on T4, ...``)
    :param remedy: what the ladder decided after it
    """

    try_number: int
    failure_class: str
    request: str
    remedy: str
    checkpoint_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the try as primitives."""
        return {
            "try_number": self.try_number,
            "failure_class": self.failure_class,
            "request": self.request,
            "remedy": self.remedy,
            "checkpoint_step": self.checkpoint_step,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TriedAttempt:
        """Return the try of :meth:`to_dict`'s primitives."""
        return cls(
            data["try_number"],
            data["failure_class"],
            data["request"],
            data["remedy"],
            data.get("checkpoint_step"),
        )


@dataclass(frozen=True)
class Escalation:
    """A GPU task that a person must look at: which try, how it failed, what was tried.

    It reaches notifiers as primitives (:meth:`to_dict`) under :data:`ESCALATION_KEY` of the
    task's context, so that notifiers can template it and tasks can log it as JSON.

    :param task: the try that escalated
    :param failure_class: how it failed (a failure class, or ``stalled`` from the checkpoint sensor)
    :param reason: the Kubernetes reason (or log pattern, or the sensor's message) behind the class
    :param decision: why a person is asked
    :param exit_code: the main container's exit code, if it terminated
    :param pod_name: the pod, if one was created
    :param last_checkpoint_step: the newest valid checkpoint step (None: none)
    :param log_tail: the last lines of the main container's log
    :param tried: the task instance's failed tries, oldest first
    :param policy: the task's ladder as ``{class: remedy}`` (None: no ladder)
    """

    task: TaskTry
    failure_class: str
    reason: str
    decision: str
    exit_code: int | None = None
    pod_name: str | None = None
    last_checkpoint_step: int | None = None
    log_tail: str = ""
    tried: tuple[TriedAttempt, ...] = ()
    policy: Mapping[str, str] | None = field(default=None, hash=False)

    def to_dict(self) -> dict[str, Any]:
        """Return the escalation as JSON-ready primitives: what notifiers find in the context."""
        return {
            "dag_id": self.task.dag_id,
            "task_id": self.task.task_id,
            "run_id": self.task.run_id,
            "map_index": self.task.map_index,
            "try_number": self.task.try_number,
            "failure_class": self.failure_class,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "pod_name": self.pod_name,
            "last_checkpoint_step": self.last_checkpoint_step,
            "log_tail": self.log_tail,
            "decision": self.decision,
            "tried": [t.to_dict() for t in self.tried],
            "policy": dict(self.policy) if self.policy is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Escalation:
        """Return the escalation of :meth:`to_dict`'s primitives (a notifier that wants it typed)."""
        policy = data.get("policy")
        return cls(
            task=TaskTry(
                data["dag_id"], data["task_id"], data["run_id"], data.get("map_index", -1), data["try_number"]
            ),
            failure_class=data["failure_class"],
            reason=data["reason"],
            decision=data["decision"],
            exit_code=data.get("exit_code"),
            pod_name=data.get("pod_name"),
            last_checkpoint_step=data.get("last_checkpoint_step"),
            log_tail=data.get("log_tail") or "",
            tried=tuple(TriedAttempt.from_dict(t) for t in data.get("tried") or ()),
            policy=dict(policy) if policy is not None else None,
        )


def format_escalation(escalation: Escalation | Mapping[str, Any]) -> str:
    """Return a short plain-text report of an escalation.

    :param escalation: the escalation, or its primitives as a notifier finds them in the context
    """
    if isinstance(escalation, Escalation):
        escalation = escalation.to_dict()
    step = escalation.get("last_checkpoint_step")
    lines = [
        f"GPU task {escalation.get('dag_id')}.{escalation.get('task_id')} (run {escalation.get('run_id')}, "
        f"try {escalation.get('try_number')}) needs a person.",
        f"Failure: {escalation.get('failure_class')} ({escalation.get('reason')}), "
        f"exit code {escalation.get('exit_code')}, pod {escalation.get('pod_name')}.",
        f"Last valid checkpoint: {'step ' + str(step) if step is not None else 'none'}.",
        f"Why escalated: {escalation.get('decision')}.",
    ]
    tried = escalation.get("tried") or []
    if tried:
        lines.append("Tried:")
        lines += [
            f"  try {t.get('try_number')}: {t.get('failure_class')} on {t.get('request')} -> {t.get('remedy')}"
            for t in tried
        ]
    tail = (escalation.get("log_tail") or "").strip()
    if tail:
        lines += ["Log tail:", *("  " + line for line in tail.splitlines()[-20:])]
    return "\n".join(lines)


def notify_escalation(
    escalation: Escalation, context: Mapping[str, Any], notifier: Callable[[Any], Any] | None = None
) -> None:
    """Call ``notifier`` with the task's context plus the escalation and its text.

    :param escalation: what to report
    :param context: the task's context
    :param notifier: an Airflow notifier or a callable taking the context (default :class:`EscalationNotifier`)
    """
    payload = escalation.to_dict()
    send = notifier or EscalationNotifier()
    send({**context, ESCALATION_KEY: payload, MESSAGE_KEY: format_escalation(payload)})


class EscalationNotifier(BaseNotifier):
    """Report an escalated GPU task: log it, and pass it to any Airflow notifiers given.

    The operator calls it with the task's context plus ``gpupool_escalation`` (the task, run,
    failure class, last checkpoint step, log tail and what was tried, as primitives) and
    ``gpupool_escalation_message`` (the same as text), so a wrapped notifier can template them,
    for example ``SlackNotifier(text="{{ gpupool_escalation_message }}")``.

    :param notifiers: Airflow notifiers (Slack, email, ...) or callables taking the context
    :param subject: first line of the logged report (templated)
    """

    template_fields = ("subject",)

    def __init__(
        self,
        *,
        notifiers: Sequence[Any] = (),
        subject: str = "GPU task escalation",
        log_level: int = logging.ERROR,
    ) -> None:
        super().__init__()
        self.notifiers = tuple(notifiers)
        self.subject = subject
        self.log_level = log_level

    def notify(self, context: Context) -> None:
        """Log the escalation, then call each wrapped notifier with the same context."""
        values: Mapping[str, Any] = context
        escalation: Mapping[str, Any] = values.get(ESCALATION_KEY) or {}
        message = values.get(MESSAGE_KEY) or format_escalation(escalation)
        self.log.log(self.log_level, "%s\n%s", self.subject, message)
        for notifier in self.notifiers:
            notifier(context)
