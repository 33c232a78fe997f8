"""Read, list and prune checkpoints on any fsspec filesystem or ObjectStoragePath."""

from __future__ import annotations

import json
import logging
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_gpupool.checkpoints.manifest import (
    CHECKPOINT_NOW_MARKER,
    COMPLETE_MARKER,
    MANIFEST_NAME,
    PINS_DIR,
    STEP_DIR_FORMAT,
    CheckpointManifest,
    CorruptCheckpointError,
    step_of,
)

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SkippedCheckpoint:
    """A step directory that is not a valid checkpoint, and why."""

    step: int
    location: str
    reason: str


@dataclass(frozen=True)
class CheckpointListing:
    """What one scan of a checkpoint location found.

    :param valid: valid checkpoints, oldest step first
    :param skipped: incomplete or corrupt step directories, oldest first
    :param complete: whether the training wrote its final marker
    :param pinned: steps that running retries resume from (never pruned)
    """

    valid: tuple[CheckpointManifest, ...] = ()
    skipped: tuple[SkippedCheckpoint, ...] = ()
    complete: bool = False
    pinned: frozenset[int] = field(default_factory=frozenset)

    @property
    def newest(self) -> CheckpointManifest | None:
        """The valid checkpoint with the highest step, if any."""
        return self.valid[-1] if self.valid else None


def _resolve(location: Any, conn_id: str | None) -> tuple[AbstractFileSystem, str, str]:
    """Return (filesystem, path, display URL) of a location."""
    if hasattr(location, "fs") and hasattr(location, "path"):  # an ObjectStoragePath (or any UPath)
        # str() of an ObjectStoragePath with a connection reads s3://<conn_id>@bucket/...; the URL
        # handed to containers (GPUPOOL_RESUME_FROM) and shown in logs is the plain one.
        url = location.as_uri() if getattr(location, "conn_id", None) else str(location)
        return location.fs, str(location.path).rstrip("/"), url
    url = str(location)
    if conn_id:
        from airflow.sdk import ObjectStoragePath

        osp = ObjectStoragePath(url, conn_id=conn_id)
        return osp.fs, str(osp.path).rstrip("/"), url
    from fsspec.core import url_to_fs

    fs, path = url_to_fs(url)
    return fs, str(path).rstrip("/") or "/", url


class CheckpointStore:
    """A checkpoint location: list valid checkpoints, find the newest, prune old ones.

    Every method does blocking I/O; async callers wrap them in :func:`asyncio.to_thread`.

    :param location: an ObjectStoragePath, or a URL or local path (``file://``, ``s3://``, ``memory://`` ...)
    :param conn_id: an Airflow connection for the filesystem (through ObjectStoragePath); None: fsspec's defaults
    """

    def __init__(self, location: Any, conn_id: str | None = None) -> None:
        self.fs, self.root, self.url = _resolve(location, conn_id)

    def _join(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def step_url(self, step: int) -> str:
        """Return the URL of step ``step``'s directory."""
        return posixpath.join(self.url.rstrip("/"), STEP_DIR_FORMAT.format(step))

    def _entries(self) -> list[tuple[str, str]]:
        try:
            listed = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        return [(posixpath.basename(str(p).rstrip("/")), str(p)) for p in listed]

    def scan(self) -> CheckpointListing:
        """List the location once: valid checkpoints, skipped (incomplete or corrupt) ones, markers."""
        self.fs.invalidate_cache()
        valid, skipped, complete = [], [], False
        for name, path in sorted(self._entries()):
            if name == COMPLETE_MARKER:
                complete = True
                continue
            step = step_of(name)
            if step is None:
                continue
            where = posixpath.join(self.url.rstrip("/"), name)
            try:
                raw = self.fs.cat_file(posixpath.join(path, MANIFEST_NAME))
            except (FileNotFoundError, IsADirectoryError):
                skipped.append(SkippedCheckpoint(step, where, f"incomplete: no {MANIFEST_NAME} yet"))
                continue
            try:
                valid.append(CheckpointManifest.parse(raw, location=where, expected_step=step))
            except CorruptCheckpointError as e:
                skipped.append(SkippedCheckpoint(step, where, e.detail))
        for item in skipped:
            log.warning("Skipping checkpoint %s: %s", item.location, item.reason)
        return CheckpointListing(
            valid=tuple(sorted(valid)),
            skipped=tuple(sorted(skipped, key=lambda s: s.step)),
            complete=complete,
            pinned=self.pinned_steps(),
        )

    def newest(self) -> CheckpointManifest | None:
        """Return the newest valid checkpoint, or None."""
        return self.scan().newest

    # -- pins: what a running retry resumes from ------------------------------------------------

    def _pin_path(self, owner: str) -> str:
        return self._join(PINS_DIR, f"{owner}.json")

    def pin(self, step: int, owner: str) -> None:
        """Protect step ``step`` from pruning while ``owner`` (a reservation id) resumes from it."""
        self.fs.makedirs(self._join(PINS_DIR), exist_ok=True)
        self.fs.pipe_file(self._pin_path(owner), json.dumps({"step": step, "owner": owner}).encode())

    def unpin(self, owner: str) -> None:
        """Remove ``owner``'s pin (idempotent)."""
        try:
            self.fs.rm_file(self._pin_path(owner))
        except FileNotFoundError:
            pass

    def pinned_steps(self) -> frozenset[int]:
        """Return the steps pinned by running retries."""
        try:
            paths = self.fs.ls(self._join(PINS_DIR), detail=False)
        except FileNotFoundError:
            return frozenset()
        steps = set()
        for path in paths:
            try:
                steps.add(int(json.loads(self.fs.cat_file(str(path)))["step"]))
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                continue  # a pin being written or removed right now
        return frozenset(steps)

    # -- retention ---------------------------------------------------------------------------

    def prune(self, keep: int, protect: Iterable[int] = ()) -> list[int]:
        """Delete all but the newest ``keep`` valid checkpoints; return the steps deleted.

        Pinned steps and ``protect`` are never deleted. Incomplete or corrupt step directories
        older than the newest valid checkpoint are leftovers of a dead writer and go too; newer
        ones may still be being written and stay.

        :param keep: how many valid checkpoints to keep (at least 1)
        :param protect: further steps to keep
        """
        if keep < 1:
            raise ValueError(f"keep_checkpoints must be at least 1, not {keep}")
        listing = self.scan()
        kept = {c.step for c in listing.valid[-keep:]} | set(protect) | set(listing.pinned)
        newest = listing.newest.step if listing.newest else -1
        doomed = [c.step for c in listing.valid if c.step not in kept]
        doomed += [s.step for s in listing.skipped if s.step < newest and s.step not in kept]
        for step in sorted(doomed):
            log.info("Pruning checkpoint %s", self.step_url(step))
            try:
                self.fs.rm(self._join(STEP_DIR_FORMAT.format(step)), recursive=True)
            except FileNotFoundError:
                pass  # another pruner (the sensor, the operator) was first
        return sorted(doomed)


# -- the early-warning flag (issue 17) ---------------------------------------------------------


def request_checkpoint(
    store: CheckpointStore, reservation_id: str, reasons: Iterable[str], at: float
) -> bool:
    """Write the ``CHECKPOINT_NOW`` flag at the top of a checkpoint location; False if it is there.

    The training reads it at its next safe point, writes a checkpoint and deletes the flag; a flag
    already present is left alone, so its first reasons (and time) are kept.

    :param reservation_id: the grant whose GPU shows warning signs
    :param reasons: what the node agent saw (rising correctable ECC errors, a non-fatal XID, heat)
    :param at: seconds since the epoch
    """
    path = store._join(CHECKPOINT_NOW_MARKER)
    if store.fs.exists(path):
        return False
    store.fs.makedirs(store.root, exist_ok=True)
    body = {"reservation_id": reservation_id, "reasons": list(reasons), "requested_at": at}
    store.fs.pipe_file(path, json.dumps(body).encode())
    return True
