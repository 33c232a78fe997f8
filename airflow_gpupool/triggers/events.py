"""Build Airflow's ``TriggerEvent`` through a typed function: its constructor is not annotated."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from airflow.triggers.base import TriggerEvent

_new_event = cast("Callable[[dict[str, Any]], TriggerEvent]", TriggerEvent)


def trigger_event(payload: dict[str, Any]) -> TriggerEvent:
    """Return the event a trigger yields.

    :param payload: what ``execute_complete`` receives as ``event``
    """
    return _new_event(payload)
