"""EscalationNotifier: tell a person that retrying a GPU task will not help."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseNotifier

if TYPE_CHECKING:
    from airflow.sdk import Context

#: The context key under which the escalation (a dict of primitives) reaches notifiers.
ESCALATION_KEY = "gpupool_escalation"
#: The context key of the rendered text, for notifiers that template a message (Slack, email).
MESSAGE_KEY = "gpupool_escalation_message"


def format_escalation(escalation: Mapping[str, Any]) -> str:
    """Return a short plain-text report of an escalation.

    :param escalation: the escalation's fields (task, run, classification, checkpoint, log tail, tries)
    """
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
