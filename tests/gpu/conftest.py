"""Real-GPU tests: marked ``gpu``, deselected unless ``-m`` names that marker.

``pytest -m gpu tests/gpu`` runs them; where NVML finds no GPU they skip with the reason. They are
never part of the default run (or of CI's ``-m "not slow"``), which has no GPU.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "gpu" in (config.option.markexpr or ""):
        return
    deselected = [item for item in items if item.get_closest_marker("gpu") is not None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item.get_closest_marker("gpu") is None]
