"""Notifiers: tell a person when retrying a GPU task will not help."""

from __future__ import annotations

from airflow_gpupool.notifiers.escalation import (
    ESCALATION_KEY,
    MESSAGE_KEY,
    EscalationNotifier,
    format_escalation,
)

__all__ = ["ESCALATION_KEY", "MESSAGE_KEY", "EscalationNotifier", "format_escalation"]
