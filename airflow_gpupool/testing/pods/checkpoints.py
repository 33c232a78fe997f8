"""Training checkpoints as the simulated kubelet writes them.

Layout under the checkpoint directory::

    step-000001/model.bin
    step-000001/manifest.json   # written last: {"step": 1, "time": "...", "metrics": {"loss": ...}}
    ...
    COMPLETE                    # written when the training finished successfully

An emergency checkpoint (written on SIGTERM, ``gpupool.emulator/checkpoint-on-sigterm``) has
``"emergency": true`` in its manifest: information for tests and people; readers of the contract
(:mod:`airflow_gpupool.checkpoints.manifest`) ignore it, it is a checkpoint like any other.

A step directory without ``manifest.json`` is incomplete and must be ignored by readers. The
directory is a local path, a ``file://`` URL, or any other URL fsspec writes (``s3://`` with the
``AWS_*`` variables, as a training container on a shared object store would).
"""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

STEP_DIR_FORMAT = "step-{:06d}"
MANIFEST_NAME = "manifest.json"
DATA_NAME = "model.bin"
COMPLETE_MARKER = "COMPLETE"
RESUME_ENV = "GPUPOOL_RESUME_FROM"
CHECKPOINT_DIR_ENV = "GPUPOOL_CHECKPOINT_DIR"
#: In a container's env, ``1`` opts the simulated training in to a checkpoint on SIGTERM.
CHECKPOINT_ON_SIGTERM_ENV = "GPUPOOL_EMULATOR_CHECKPOINT_ON_SIGTERM"

_TRAILING_NUMBER = re.compile(r"(\d+)/*$")


def is_local(location: str) -> bool:
    """Return whether a checkpoint location is a local path or a ``file://`` URL.

    :param location: a path or URL
    """
    scheme = urlparse(location).scheme
    return scheme == "file" or len(scheme) <= 1  # one letter: a Windows drive


def plan_root(location: str) -> Path | str:
    """Return where the emulator writes a location's checkpoints: a local Path, or the URL itself.

    :param location: a local path, a ``file://`` URL or an fsspec URL (``s3://bucket/run``)
    """
    return local_path(location) if is_local(location) else location.rstrip("/")


def local_path(location: str) -> Path:
    """Return the local path of a checkpoint location.

    :param location: a local path or a ``file://`` URL
    :raises ValueError: for any other URL scheme
    """
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:
        raise ValueError(
            f"the emulator writes checkpoints to local paths or file:// URLs only, not {location!r}"
        )
    return Path(location)


def resume_step(value: str | None) -> int:
    """Return the step a resumed run starts after, read from ``GPUPOOL_RESUME_FROM``.

    :param value: a step number, a step directory name or a path or URL ending in one
        (``3``, ``step-000003``, ``file:///ckpt/step-000003/``); empty means a fresh start
    """
    if not value:
        return 0
    match = _TRAILING_NUMBER.search(value.strip())
    return int(match.group(1)) if match else 0


def loss_at(step: int) -> float:
    """Return the simulated training loss after a step.

    :param step: the step number
    """
    return round(2.5 / (1 + step) + 0.05, 6)


def _step_files(step: int, now: datetime.datetime | None, emergency: bool = False) -> tuple[bytes, str]:
    """Return a step's data file and manifest."""
    when = now or datetime.datetime.now(tz=datetime.UTC)
    manifest: dict[str, object] = {"step": step, "time": when.isoformat(), "metrics": {"loss": loss_at(step)}}
    if emergency:
        manifest["emergency"] = True
    return f"weights-after-step-{step}\n".encode() * 4, json.dumps(manifest, sort_keys=True)


def write_step(
    root: Path, step: int, *, now: datetime.datetime | None = None, emergency: bool = False
) -> Path:
    """Write one checkpoint step: its data file first, its manifest last (atomically).

    :param root: the checkpoint directory
    :param step: the step number
    :param now: the time recorded in the manifest
    :param emergency: mark it written on SIGTERM
    """
    step_dir = root / STEP_DIR_FORMAT.format(step)
    step_dir.mkdir(parents=True, exist_ok=True)
    data, manifest = _step_files(step, now, emergency)
    (step_dir / DATA_NAME).write_bytes(data)
    partial = step_dir / f".{MANIFEST_NAME}.partial"
    partial.write_text(manifest)
    os.replace(partial, step_dir / MANIFEST_NAME)
    return step_dir


def write_step_url(
    url: str, step: int, *, now: datetime.datetime | None = None, emergency: bool = False
) -> str:
    """Write one checkpoint step through fsspec: data first, manifest last; return its URL.

    An object store's PUT is atomic, so the manifest needs no rename to appear whole.

    :param url: the checkpoint location (``s3://bucket/run``)
    :param step: the step number
    :param now: the time recorded in the manifest
    :param emergency: mark it written on SIGTERM
    """
    from fsspec.core import url_to_fs

    fs, root = url_to_fs(url)
    step_dir = f"{str(root).rstrip('/')}/{STEP_DIR_FORMAT.format(step)}"
    data, manifest = _step_files(step, now, emergency)
    fs.pipe_file(f"{step_dir}/{DATA_NAME}", data)
    fs.pipe_file(f"{step_dir}/{MANIFEST_NAME}", manifest.encode())
    return f"{url.rstrip('/')}/{STEP_DIR_FORMAT.format(step)}"


def save_step(root: Path | str, step: int, *, emergency: bool = False) -> None:
    """Write one step where :func:`plan_root` said: a local directory or a URL.

    :param root: a local Path or an fsspec URL
    :param step: the step number
    :param emergency: mark it written on SIGTERM
    """
    if isinstance(root, Path):
        write_step(root, step, emergency=emergency)
    else:
        write_step_url(root, step, emergency=emergency)


def save_complete(root: Path | str, last_step: int) -> None:
    """Write the ``COMPLETE`` marker where :func:`plan_root` said.

    :param root: a local Path or an fsspec URL
    :param last_step: the final step
    """
    if isinstance(root, Path):
        write_complete(root, last_step)
        return
    from fsspec.core import url_to_fs

    fs, path = url_to_fs(root)
    fs.pipe_file(f"{str(path).rstrip('/')}/{COMPLETE_MARKER}", json.dumps({"step": last_step}).encode())


def write_complete(root: Path, last_step: int) -> Path:
    """Write the ``COMPLETE`` marker of a finished training.

    :param root: the checkpoint directory
    :param last_step: the final step
    """
    root.mkdir(parents=True, exist_ok=True)
    marker = root / COMPLETE_MARKER
    marker.write_text(json.dumps({"step": last_step}))
    return marker
