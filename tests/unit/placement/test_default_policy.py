"""The default policy's name is written once, in settings, and placement offers that policy."""

from __future__ import annotations

import pytest

from airflow_gpupool import settings
from airflow_gpupool.get_provider_info import get_provider_info
from airflow_gpupool.placement import DEFAULT_POLICY, policy_names
from airflow_gpupool.placement.fgd import GpuPoolPolicy
from airflow_gpupool.placement.policy import get_policy


def test_the_default_policy_is_settings_and_is_registered() -> None:
    assert DEFAULT_POLICY == settings.DEFAULT_POLICY
    assert DEFAULT_POLICY in policy_names()
    assert isinstance(get_policy(DEFAULT_POLICY), GpuPoolPolicy)


def test_empty_placement_policy_reads_as_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__PLACEMENT_POLICY", "")
    assert settings.placement_policy() == DEFAULT_POLICY
    monkeypatch.setenv("AIRFLOW__GPUPOOL__PLACEMENT_POLICY", "fgd")
    assert settings.placement_policy() == "fgd"


def test_the_declared_option_names_the_default() -> None:
    option = get_provider_info()["config"]["gpupool"]["options"]["placement_policy"]
    assert f"({DEFAULT_POLICY})" in option["description"]
