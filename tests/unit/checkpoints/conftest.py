"""Checkpoint locations to run the same tests on: a local directory and an fsspec memory filesystem."""

from __future__ import annotations

import json
import posixpath
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs


@dataclass
class Location:
    """A checkpoint location and a writer that follows (or breaks) the contract."""

    url: str
    fs: AbstractFileSystem
    root: str

    def write(
        self,
        step: int,
        *,
        manifest: Any = "valid",
        loss: float = 1.0,
        time: str = "2026-01-01T00:00:00+00:00",
    ) -> None:
        step_dir = posixpath.join(self.root, f"step-{step:06d}")
        self.fs.makedirs(step_dir, exist_ok=True)
        self.fs.pipe_file(posixpath.join(step_dir, "model.bin"), b"weights")
        if manifest is None:
            return  # incomplete: the writer died before the manifest
        body = (
            manifest
            if isinstance(manifest, bytes)
            else json.dumps(
                {"step": step, "time": time, "metrics": {"loss": loss}} if manifest == "valid" else manifest
            ).encode()
        )
        self.fs.pipe_file(posixpath.join(step_dir, "manifest.json"), body)

    def complete(self) -> None:
        self.fs.pipe_file(posixpath.join(self.root, "COMPLETE"), b"{}")

    def steps(self) -> list[str]:
        return sorted(
            posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self.root, detail=False) if "step-" in p
        )


@pytest.fixture(params=["local", "memory"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Location]:
    url = str(tmp_path / "ckpt") if request.param == "local" else f"memory://ckpt-{uuid.uuid4().hex}"
    fs, root = url_to_fs(url)
    fs.makedirs(root, exist_ok=True)
    yield Location(url, fs, root)
    if request.param == "memory":
        fs.rm(root, recursive=True)
