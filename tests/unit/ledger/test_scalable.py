"""Scalable pools as the ledger keeps them: the empty node's stored form, and which pool a request waits for."""

from __future__ import annotations

import pytest

from airflow_gpupool.controller.autoscale.pools import ScalablePool, empty_node
from airflow_gpupool.ledger.store.scalable import ScalableShape, node_from_dict, node_to_dict, pool_that_fits
from airflow_gpupool.resources import GangSpec, GpuRequest

A100 = "NVIDIA-A100-SXM4-80GB"
WHOLE = ScalableShape("whole", "config", empty_node(ScalablePool("whole", A100, 8, 81920)))
MIG = ScalableShape("mig", "config", empty_node(ScalablePool("mig", A100, 1, 81920, mig=(("1g.10gb", 7),))))


@pytest.mark.parametrize("shape", [WHOLE, MIG], ids=lambda s: s.name)
def test_the_stored_form_gives_back_the_same_empty_node(shape: ScalableShape) -> None:
    assert node_from_dict(node_to_dict(shape.node)) == shape.node


@pytest.mark.parametrize(
    ("request_", "pool"),
    [
        pytest.param(GpuRequest(gpus=8), "whole", id="a whole node of GPUs"),
        pytest.param(GpuRequest(gpus=9), None, id="more than a node has"),
        pytest.param(GpuRequest(mig_profile="1g.10gb"), "mig", id="a MIG slice: the MIG pool"),
        pytest.param(GpuRequest(gpu_milli=250), "whole", id="a fraction"),
        pytest.param(GpuRequest(gpus=4, gang=GangSpec(4, 4)), "whole", id="a gang: one member a node"),
        pytest.param(GpuRequest(cpu_milli=1000), None, id="CPU only: never waits for a GPU node"),
        pytest.param(GpuRequest(gpus=1, gpu_models=frozenset({"H100"})), None, id="a model no pool has"),
    ],
)
def test_which_pool_a_request_waits_for(request_: GpuRequest, pool: str | None) -> None:
    found, reasons = pool_that_fits([WHOLE, MIG], request_)
    assert found == pool
    if pool is None and request_.gpus:
        assert {r.node for r in reasons} == {"whole-empty", "mig-empty"}  # each pool's node says why
