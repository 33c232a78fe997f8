"""The inventory package's public names, including those that moved to the controller."""

from __future__ import annotations

import pytest


def test_names_that_moved_to_the_controller_are_still_importable_from_inventory() -> None:
    import airflow_gpupool.inventory as inventory
    from airflow_gpupool.controller import reconcile as module

    assert inventory.reconcile is module.reconcile
    assert inventory.reconcile_grant is module.reconcile_grant
    assert inventory.ReconcileResult is module.ReconcileResult
    with pytest.raises(AttributeError):
        inventory.no_such_name  # noqa: B018
