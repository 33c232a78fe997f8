"""The checkpoint locations of tests/unit/checkpoints (local directory, fsspec memory filesystem)."""

from __future__ import annotations

from tests.unit.checkpoints.conftest import Location, location

__all__ = ["Location", "location"]
