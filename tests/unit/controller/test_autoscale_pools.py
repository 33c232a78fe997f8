"""``[gpupool] scalable_node_pools``: what a pool's declaration accepts, and the error naming the key it refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_gpupool.controller.autoscale.pools import ScalablePool, parse_scalable_pools
from airflow_gpupool.controller.autoscale.step import AutoscaleSettings
from airflow_gpupool.exceptions import ConfigurationError

GOOD = {"gpu_model": "NVIDIA-A100-SXM4-80GB", "gpus": 8, "gpu_memory_mib": 81920}


def test_a_declared_pool_is_read_with_its_shape() -> None:
    text = json.dumps({"burst": {**GOOD, "cpu": "96", "memory": "1Ti", "labels": {"team": "ml"}, "mig": {}}})
    assert parse_scalable_pools(text) == (
        ScalablePool("burst", "NVIDIA-A100-SXM4-80GB", 8, 81920, "96", "1Ti", (), (("team", "ml"),)),
    )
    assert parse_scalable_pools("  ") == ()


BAD: dict[str, tuple[Any, str]] = {
    "not JSON": ("{burst", "not valid JSON"),
    "a list": ([GOOD], "expected a JSON object of pool name to shape"),
    "an entry not an object": ({"burst": 8}, "'burst': expected an object"),
    "a missing key": ({"burst": {"gpus": 8, "gpu_memory_mib": 1}}, "'burst': missing key 'gpu_model'"),
    "an unknown key": ({"burst": {**GOOD, "gpu": 8}}, "'burst': unknown key(s) ['gpu']"),
    "a count of text": ({"burst": {**GOOD, "gpus": "8"}}, "'burst'.gpus: '8' is not an integer"),
    "no GPUs": ({"burst": {**GOOD, "gpus": 0}}, "'burst'.gpus: 0 is not an integer of at least 1"),
    "a boolean memory": ({"burst": {**GOOD, "gpu_memory_mib": True}}, "'burst'.gpu_memory_mib: True"),
    "an unknown MIG profile": ({"burst": {**GOOD, "mig": {"9g.99gb": 1}}}, "'burst'.mig: {'9g.99gb': 1}"),
    "a CPU that is no quantity": (
        {"burst": {**GOOD, "cpu": "lots"}},
        "'burst'.cpu: 'lots' is not a Kubernetes",
    ),
    "a bad label": ({"burst": {**GOOD, "labels": {"bad key!": "x"}}}, "'burst': "),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_a_bad_declaration_names_what_is_wrong(case: str) -> None:
    value, message = BAD[case]
    text = value if isinstance(value, str) else json.dumps(value)
    with pytest.raises(ConfigurationError, match="scalable_node_pools") as raised:
        parse_scalable_pools(text)
    assert message in str(raised.value)


def test_bad_step_settings_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="autoscale_mode: 'sometimes'"):
        AutoscaleSettings(mode="sometimes")
    with pytest.raises(ConfigurationError, match="provisioning_class: 'fast'"):
        AutoscaleSettings(provisioning_class="fast")
