"""The checkpoint contract: step directories whose manifest, written last, makes them valid.

Layout under a checkpoint location (any URL that fsspec or Airflow's ObjectStoragePath reads)::

    step-000001/...              # whatever the training writes (weights, optimizer state)
    step-000001/manifest.json    # written LAST: {"step": 1, "time": "<ISO 8601>", "metrics": {...}}
    COMPLETE                     # written once the training finished successfully
    CHECKPOINT_NOW               # written by gpupool: the GPU shows warning signs, checkpoint soon

A step directory without a readable manifest is incomplete (still being written, or the
writer died) or corrupt; readers skip it.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass, field
from typing import Any

# Defined with the other errors; re-exported here, its first home.
from airflow_gpupool.exceptions import CorruptCheckpointError

# With the other names on pods (the gatekeeper reads it on gated pods); re-exported here too.
from airflow_gpupool.labels import CHECKPOINT_DIR_ENV

__all__ = [
    "CHECKPOINT_DIR_ENV",
    "CHECKPOINT_NOW_MARKER",
    "COMPLETE_MARKER",
    "MANIFEST_NAME",
    "PINS_DIR",
    "RESUME_ENV",
    "STEP_DIR_FORMAT",
    "STEP_PREFIX",
    "CheckpointManifest",
    "CorruptCheckpointError",
    "manifest_bytes",
    "step_of",
]

STEP_PREFIX = "step-"
STEP_DIR_FORMAT = "step-{:06d}"
MANIFEST_NAME = "manifest.json"
COMPLETE_MARKER = "COMPLETE"
PINS_DIR = ".gpupool-pins"
#: The early-warning flag (issue 17): the controller writes it when the node agent sees warning
#: signs on the task's GPU; the training checkpoints at its next safe point, then deletes it.
CHECKPOINT_NOW_MARKER = "CHECKPOINT_NOW"
RESUME_ENV = "GPUPOOL_RESUME_FROM"

_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_of(name: str) -> int | None:
    """Return the step number of a step directory name, or None for any other name.

    :param name: a base name such as ``step-000123``
    """
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, order=True)
class CheckpointManifest:
    """One valid checkpoint: its step, when it was written, its metrics and where it lies.

    :param step: the training step (ordering key)
    :param time: when the manifest was written (timezone-aware)
    :param metrics: numbers the training reported (loss, accuracy, ...)
    :param location: the step directory's URL
    """

    step: int
    time: datetime.datetime = field(compare=False)
    metrics: dict[str, Any] = field(compare=False, default_factory=dict)
    location: str = field(compare=False, default="")

    @classmethod
    def parse(
        cls, raw: bytes | str, *, location: str, expected_step: int | None = None
    ) -> CheckpointManifest:
        """Parse a manifest's bytes; raise :class:`CorruptCheckpointError` if it breaks the contract.

        :param raw: the content of ``manifest.json``
        :param location: the step directory (for messages and :attr:`location`)
        :param expected_step: the step the directory name says; the manifest must agree
        """
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptCheckpointError(location, f"{MANIFEST_NAME} is not JSON ({e})") from e
        if not isinstance(data, dict):
            raise CorruptCheckpointError(location, f"{MANIFEST_NAME} is not a JSON object")
        step = data.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CorruptCheckpointError(location, f"step {step!r} is not a non-negative integer")
        if expected_step is not None and step != expected_step:
            raise CorruptCheckpointError(
                location, f"manifest says step {step}, the directory says {expected_step}"
            )
        metrics = data.get("metrics", {})
        if not isinstance(metrics, dict):
            raise CorruptCheckpointError(location, f"metrics {metrics!r} is not an object")
        return cls(
            step=step, time=_parse_time(data.get("time"), location), metrics=metrics, location=location
        )

    def to_dict(self) -> dict[str, Any]:
        """Return primitives only (XCom, trigger events, notifications)."""
        return {
            "step": self.step,
            "time": self.time.isoformat(),
            "metrics": self.metrics,
            "location": self.location,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckpointManifest:
        """Rebuild from :meth:`to_dict` output."""
        return cls(
            step=int(data["step"]),
            time=_parse_time(data["time"], data.get("location", "")),
            metrics=dict(data.get("metrics") or {}),
            location=data.get("location", ""),
        )


def _parse_time(value: Any, location: str) -> datetime.datetime:
    if not isinstance(value, str):
        raise CorruptCheckpointError(location, f"time {value!r} is not an ISO 8601 string")
    try:
        when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise CorruptCheckpointError(location, f"time {value!r} is not ISO 8601") from e
    return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)


def manifest_bytes(
    step: int, metrics: dict[str, Any] | None = None, *, when: datetime.datetime | None = None
) -> bytes:
    """Return the manifest of ``step`` as a training container should write it (last, atomically).

    :param step: the step number
    :param metrics: numbers to report
    :param when: the time to record (default now, UTC)
    """
    moment = when or datetime.datetime.now(tz=datetime.UTC)
    return json.dumps(
        {"step": step, "time": moment.isoformat(), "metrics": metrics or {}}, sort_keys=True
    ).encode()
