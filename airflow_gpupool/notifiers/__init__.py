"""Notifiers: tell a person when retrying a GPU task will not help."""

from __future__ import annotations

from airflow_gpupool.notifiers.escalation import (
    ESCALATION_KEY,
    MESSAGE_KEY,
    Escalation,
    EscalationNotifier,
    TriedAttempt,
    format_escalation,
    notify_escalation,
)

__all__ = [
    "ESCALATION_KEY",
    "MESSAGE_KEY",
    "Escalation",
    "EscalationNotifier",
    "TriedAttempt",
    "format_escalation",
    "notify_escalation",
]
