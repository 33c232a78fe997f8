"""EscalationNotifier: the report, and forwarding to any Airflow notifier."""

from __future__ import annotations

import logging
from typing import Any
from unittest import mock

from airflow.sdk import BaseNotifier

from airflow_gpupool.notifiers import ESCALATION_KEY, MESSAGE_KEY, EscalationNotifier, format_escalation

ESCALATION = {
    "dag_id": "retrain",
    "task_id": "train",
    "run_id": "manual__1",
    "try_number": 3,
    "failure_class": "application_error",
    "reason": "Error",
    "exit_code": 1,
    "pod_name": "train-abc",
    "last_checkpoint_step": 42,
    "decision": "application_error: retries exhausted",
    "tried": [{"try_number": 1, "failure_class": "preempted", "request": "1 GPU", "remedy": "retry"}],
    "log_tail": "epoch 9\nRuntimeError: boom\n",
}


class Templated(BaseNotifier):
    """A notifier that templates its text from the context, as Slack or email notifiers do."""

    template_fields = ("text",)

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.sent: list[str] = []

    def notify(self, context: Any) -> None:
        self.sent.append(self.text)


def test_report_names_task_run_class_checkpoint_tries_and_log_tail() -> None:
    text = format_escalation(ESCALATION)

    assert text.splitlines()[0] == "GPU task retrain.train (run manual__1, try 3) needs a person."
    assert "Failure: application_error (Error), exit code 1, pod train-abc." in text
    assert "Last valid checkpoint: step 42." in text
    assert "  try 1: preempted on 1 GPU -> retry" in text
    assert text.endswith("Log tail:\n  epoch 9\n  RuntimeError: boom")


def test_logs_and_forwards_to_wrapped_notifiers() -> None:
    slack = Templated(
        "{{ gpupool_escalation.task_id }} stuck at step {{ gpupool_escalation.last_checkpoint_step }}"
    )
    calls: list[Any] = []
    notifier = EscalationNotifier(notifiers=[slack, calls.append])

    with mock.patch.object(EscalationNotifier, "log", new_callable=mock.PropertyMock) as log_property:
        notifier({ESCALATION_KEY: ESCALATION, MESSAGE_KEY: format_escalation(ESCALATION)})
    log = log_property.return_value

    assert slack.sent == ["train stuck at step 42"]
    assert calls[0][ESCALATION_KEY] is ESCALATION
    log.log.assert_called_once_with(
        logging.ERROR, "%s\n%s", "GPU task escalation", format_escalation(ESCALATION)
    )
