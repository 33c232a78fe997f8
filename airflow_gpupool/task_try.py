"""The identity of one try of one task instance, and the strings the ledger keeps it under.

Three encodings, each pinned by the data already stored in ledgers, so none may change:

- the reservation id (``gp-`` and 32 hex digits): stable across deferrals, new for each retry;
- the holder (``dag/task/run/map-<i>/try-<n>@host``): what the UI links back to the task instance;
- the task key (``dag/task/run/map-<i>``): what all tries of a task instance share.

Importing this module imports nothing from Airflow: the ledger, the operators and the UI all use it.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_KEY_LENGTH", "RESERVATION_ID_PREFIX", "TaskTry", "parse_holder"]

#: How the reservation ids of task tries start: reconcile judges only these unless told otherwise.
RESERVATION_ID_PREFIX = "gp-"

#: The ledger's column width for holders and task keys (longer strings are cut, as they always were).
MAX_KEY_LENGTH = 512


@dataclass(frozen=True)
class TaskTry:
    """One try of a task instance.

    :param dag_id: the DAG
    :param task_id: the task
    :param run_id: the DAG run
    :param map_index: the mapped instance; -1 for an unmapped task
    :param try_number: the try, from 1
    :param host: the machine the try runs on (only the holder carries it)
    """

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1
    try_number: int = 1
    host: str = ""

    @classmethod
    def from_context(cls, context: Mapping[str, Any], *, host: str | None = None) -> TaskTry:
        """Return the try of a task's Airflow context (its ``ti``).

        :param context: the task's context
        :param host: the machine; default this one
        """
        ti = context["ti"]
        return cls(
            dag_id=ti.dag_id,
            task_id=ti.task_id,
            run_id=ti.run_id,
            map_index=getattr(ti, "map_index", -1),
            try_number=ti.try_number,
            host=socket.gethostname() if host is None else host,
        )

    @classmethod
    def from_holder(cls, holder: str) -> TaskTry | None:
        """Parse ``dag_id/task_id/run_id/map-<i>/try-<n>@host``; return None for any other holder.

        A run id may itself contain ``/``: everything between the task id and ``map-`` is the run id.

        :param holder: a reservation's holder string
        """
        base, at, host = holder.rpartition("@")
        if not at:
            base, host = holder, ""
        parts = base.split("/")
        if len(parts) < 5 or not parts[-2].startswith("map-") or not parts[-1].startswith("try-"):
            return None
        try:
            map_index = int(parts[-2][4:])
            try_number = int(parts[-1][4:])
        except ValueError:
            return None
        run_id = "/".join(parts[2:-2])
        if not parts[0] or not parts[1] or not run_id:
            return None
        return cls(parts[0], parts[1], run_id, map_index, try_number, host)

    @property
    def reservation_id(self) -> str:
        """The reservation id of this try: stable across deferrals, new per retry."""
        key = f"{self.dag_id}|{self.task_id}|{self.run_id}|{self.map_index}|{self.try_number}"
        return RESERVATION_ID_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:32]

    @property
    def task_key(self) -> str:
        """The task instance without the try: what its tries share in the ledger."""
        return f"{self.dag_id}/{self.task_id}/{self.run_id}/map-{self.map_index}"[:MAX_KEY_LENGTH]

    @property
    def holder(self) -> str:
        """The holder string the ledger shows for this try's reservation."""
        base = f"{self.dag_id}/{self.task_id}/{self.run_id}/map-{self.map_index}"
        return f"{base}/try-{self.try_number}@{self.host}"[:MAX_KEY_LENGTH]


def parse_holder(holder: str) -> TaskTry | None:
    """Return the task try a holder string names, or None (:meth:`TaskTry.from_holder`).

    :param holder: a reservation's holder string
    """
    return TaskTry.from_holder(holder)
