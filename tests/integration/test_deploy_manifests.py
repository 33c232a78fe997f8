"""The values for the official Apache Airflow Helm chart against the code and ``deploy/kustomize``.

``helm`` cannot be installed where the tests run (not in Debian, no binary on PyPI), so the chart is
never rendered: the values file is checked as YAML whose every key the chart's ``values.yaml``
documents, and each value that names something of ours (the hook's connection, the executor
hook's import, the ServiceAccount, the Secret) is checked against that thing.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_gpupool.demo.run import LOCAL_SETTINGS
from airflow_gpupool.hooks.gpupool import GpuPoolHook

ROOT = Path(__file__).resolve().parents[2]
HELM_VALUES = ROOT / "docker" / "helm" / "airflow-values.yaml"
BASE = ROOT / "deploy" / "kustomize" / "base"

#: Key paths the chart documents in chart/values.yaml (apache/airflow), one per value set here.
#: ``config`` is free-form (sections and options of airflow.cfg), as are list items.
CHART_KEYS = {
    "images.airflow.repository",
    "images.airflow.tag",
    "images.airflow.pullPolicy",
    "executor",
    "allowPodLaunching",
    "workers.serviceAccount.create",
    "workers.serviceAccount.name",
    "triggerer.enabled",
    "triggerer.replicas",
    "triggerer.serviceAccount.create",
    "triggerer.serviceAccount.name",
    "triggerer.resources",
    "secret",
    "data.metadataSecretName",
    "postgresql.enabled",
    "env",
    "config",
    "airflowLocalSettings",
}
FREE_FORM = {"config", "triggerer.resources", "secret", "env"}


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(HELM_VALUES.read_text())
    return loaded


def _paths(values: Any, prefix: str = "") -> set[str]:
    if not isinstance(values, dict) or prefix in FREE_FORM:
        return {prefix}
    return {
        path for key, value in values.items() for path in _paths(value, f"{prefix}.{key}" if prefix else key)
    }


def test_the_helm_values_use_only_keys_the_chart_documents(values: dict[str, Any]) -> None:
    assert _paths(values) == CHART_KEYS
    for item in values["secret"]:
        assert set(item) == {"envName", "secretName", "secretKey"}
    for item in values["env"]:
        assert set(item) == {"name", "value"}


def test_the_executor_hook_is_installed_as_make_demo_installs_it(values: dict[str, Any]) -> None:
    from airflow_gpupool import executor_hook

    settings = values["airflowLocalSettings"]
    assert settings == LOCAL_SETTINGS
    namespace: dict[str, Any] = {}
    exec(compile(settings, "airflow_local_settings.py", "exec"), namespace)  # what Airflow does with it
    assert namespace["pod_mutation_hook"] is executor_hook.pod_mutation_hook
    # The composing form the comment shows exists too.
    assert "compose(my_team_hook, gpupool_hook)" in HELM_VALUES.read_text() and callable(
        executor_hook.compose
    )


@pytest.mark.parametrize(
    "path",
    [HELM_VALUES, ROOT / "README.md", ROOT / "docs" / "deploying.md", ROOT / "docs" / "executor-hook.md"],
)
def test_no_stale_word_that_the_hook_is_missing(path: Path) -> None:
    text = " ".join(path.read_text().split()).lower()
    for stale in ("not written yet", "until it exists", "left as a comment"):
        assert stale not in text


def test_the_ledger_connection_is_the_hook_s_default_read_from_the_one_ledger_secret(
    values: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    (ledger,) = values["secret"]
    assert ledger["envName"] == f"AIRFLOW_CONN_{GpuPoolHook.default_conn_name.upper()}"
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    (secret,) = kustomization["secretGenerator"]
    assert secret["name"] == ledger["secretName"] and secret["options"]["disableNameSuffixHash"] is True
    # The Secret's value, a postgresql:// URL, given to Airflow as the connection: the hook finds
    # the same ledger the controller and the agent find through GPUPOOL_LEDGER_URL.
    (line,) = [x for x in (BASE / "ledger.env.example").read_text().splitlines() if x.startswith("url=")]
    key, url = line.split("=", 1)
    assert key == ledger["secretKey"]
    monkeypatch.delenv("GPUPOOL_LEDGER_URL", raising=False)
    monkeypatch.setenv(ledger["envName"], url)
    assert GpuPoolHook().options.ledger_url == url


def test_the_workers_and_the_triggerer_run_as_the_operators_account(values: dict[str, Any]) -> None:
    accounts = {values[c]["serviceAccount"]["name"] for c in ("workers", "triggerer")}
    assert accounts == {"gpupool-operator"}
    assert not any(values[c]["serviceAccount"]["create"] for c in ("workers", "triggerer"))
    rbac = list(yaml.safe_load_all((BASE / "operator-rbac.yaml").read_text()))
    assert {d["metadata"]["name"] for d in rbac if d["kind"] == "ServiceAccount"} == accounts
    assert values["triggerer"]["enabled"] is True and values["config"]["triggerer"]["capacity"] >= 100


def test_the_plugin_and_the_options_come_with_the_provider(values: dict[str, Any]) -> None:
    from airflow_gpupool.get_provider_info import get_provider_info

    # The image installs the package; Airflow loads the plugin from its entry point, with no value.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    module, _, name = project["entry-points"]["airflow.plugins"]["gpupool"].partition(":")
    assert getattr(importlib.import_module(module), name).name == "gpupool"
    assert values["images"]["airflow"]["tag"] == project["version"]
    options = get_provider_info()["config"]["gpupool"]["options"]
    assert set(values["config"]["gpupool"]) <= set(options)
