"""Deployment assets against what they deploy into: the Kubernetes API schemas, the code's own API
calls (RBAC that covers exactly them), the Prometheus Operator's ServiceMonitor, and the keys
the official Apache Airflow Helm chart documents.

``kubernetes-validate`` carries the API server's OpenAPI schemas, so the manifests are checked
offline and strictly (an unknown field fails). ``helm`` cannot be installed here: the values file
is checked as YAML whose every key the chart's ``values.yaml`` documents.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "docker" / "kubernetes"
HELM_VALUES = ROOT / "docker" / "helm" / "airflow-values.yaml"
KUBERNETES_VERSION = "1.30.0"  # the level the emulator serves; the manifests use nothing newer
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def _documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(KUBERNETES.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found.append((str(path.relative_to(KUBERNETES)), doc))
    return found


DOCUMENTS = _documents()


@pytest.mark.parametrize(
    ("path", "doc"),
    DOCUMENTS,
    ids=[f"{path}:{doc['kind']}/{doc['metadata']['name']}" for path, doc in DOCUMENTS],
)
def test_every_manifest_validates_against_the_kubernetes_schemas(path: str, doc: dict[str, Any]) -> None:
    import kubernetes_validate

    if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
        # No schema ships for custom resources: the ServiceMonitor is checked against its Service below.
        assert doc["kind"] == "ServiceMonitor" and path.startswith("prometheus-operator/")
        return
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_wrong_manifest_is_caught() -> None:
    import kubernetes_validate

    bad = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {"replicas": "two"},
    }
    with pytest.raises(kubernetes_validate.ValidationError, match="'two' is not of type 'integer'"):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)
    unknown = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x"}, "automount": True}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(unknown, KUBERNETES_VERSION, strict=True)


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in DOCUMENTS if doc["kind"] == kind}


def test_the_service_monitor_scrapes_the_exporter_service() -> None:
    (monitor,) = _by_kind("ServiceMonitor").values()
    service = _by_kind("Service")["gpupool-metrics"]
    deployment = _by_kind("Deployment")["gpupool-metrics"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["gpupool", "metrics", "serve"]
    assert container["args"] == ["--bind", "0.0.0.0", "--port", "9464"]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


# --- RBAC: exactly the API calls the code makes ----------------------------------------------

#: Kubernetes client methods and the permission each needs: (API group, resource, verb), and
#: whether the call crosses namespaces (then only a ClusterRole grants it).
API_CALLS = {
    "list_node": (("", "nodes", "list"), True),
    "read_node": (("", "nodes", "get"), True),
    "list_pod_for_all_namespaces": (("", "pods", "list"), True),
    "read_pod": (("", "pods", "get"), False),  # KubernetesPodOperator's pod manager
    "read_namespaced_pod": (("", "pods", "get"), False),
    "list_namespaced_pod": (("", "pods", "list"), False),
    "patch_namespaced_pod": (("", "pods", "patch"), False),
    "delete_namespaced_pod": (("", "pods", "delete"), False),
    "create_namespaced_event": (("", "events", "create"), False),
    "read_namespaced_lease": (("coordination.k8s.io", "leases", "get"), False),
    "create_namespaced_lease": (("coordination.k8s.io", "leases", "create"), False),
    "replace_namespaced_lease": (("coordination.k8s.io", "leases", "update"), False),
    "read_priority_class": (("scheduling.k8s.io", "priorityclasses", "get"), True),
    "create_priority_class": (("scheduling.k8s.io", "priorityclasses", "create"), True),
    "create_namespaced_pod": (("", "pods", "create"), False),
    "list_namespaced_pod_template": (("", "podtemplates", "list"), False),
    "create_namespaced_pod_template": (("", "podtemplates", "create"), False),
    "delete_namespaced_pod_template": (("", "podtemplates", "delete"), False),
    # The only custom objects the code touches: Cluster Autoscaler's ProvisioningRequests.
    "list_namespaced_custom_object": (("autoscaling.x-k8s.io", "provisioningrequests", "list"), False),
    "create_namespaced_custom_object": (("autoscaling.x-k8s.io", "provisioningrequests", "create"), False),
    "delete_namespaced_custom_object": (("autoscaling.x-k8s.io", "provisioningrequests", "delete"), False),
    # The only cluster-scoped custom objects: Karpenter's NodePools.
    "list_cluster_custom_object": (("karpenter.sh", "nodepools", "list"), True),
}
_CALL = re.compile(
    r"\.((?:list|read|create|delete|replace|patch)_\w*(?:pod|node|event|lease|priority_class|custom_object)\w*)\b"
)
#: A list method handed to ``watch.Watch().stream``: the call is a watch, which needs ``watch`` too.
_WATCHED = re.compile(r"\.stream\(\s*\w+\.(list_\w+)\b")


def calls_in(*paths: str, cluster_wide_only: bool = False) -> set[tuple[str, str, str]]:
    """Return the permissions the Kubernetes calls in some source files need."""
    needed = set()
    for path in paths:
        source = (ROOT / "airflow_gpupool" / path).read_text()
        watched = set(_WATCHED.findall(source))
        for method in _CALL.findall(source):
            assert method in API_CALLS, f"{path} calls {method}: add its permission to API_CALLS"
            permission, cluster_wide = API_CALLS[method]
            if cluster_wide or not cluster_wide_only:
                needed.add(permission)
                if method in watched:
                    needed.add((*permission[:2], "watch"))
    return needed


def granted(role_names: set[str]) -> set[tuple[str, str, str]]:
    """Return the permissions some Roles and ClusterRoles grant."""
    roles = {**_by_kind("ClusterRole"), **_by_kind("Role")}
    return {
        (group, resource, verb)
        for name in role_names
        for rule in roles[name]["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_controller_may_do_exactly_what_its_code_does() -> None:
    controller = sorted(
        str(p.relative_to(ROOT / "airflow_gpupool"))
        for p in (ROOT / "airflow_gpupool" / "controller").rglob("*.py")
    )
    needed = calls_in(*controller, "inventory/sync.py")
    assert needed == granted({"gpupool-controller", "gpupool-controller-leader-election"})
    # Cluster-wide: reconcile lists pods in every namespace, so a namespaced Role would not do.
    assert ("", "pods", "list") in granted({"gpupool-controller"})


def test_the_operator_account_covers_its_cluster_wide_calls() -> None:
    # A task's lease renewal reconciles its grant (controller/reconcile.py lists pods by label in
    # every namespace); an unschedulable pod is checked against its node; `gpupool inventory sync`.
    cluster_calls = calls_in(
        "controller/reconcile.py", "operators/unschedulable.py", "inventory/sync.py", cluster_wide_only=True
    )
    assert cluster_calls == granted({"gpupool-operator-cluster"})
    # What KubernetesPodOperator does in the namespace its pods run in.
    assert granted({"gpupool-operator"}) == {
        ("", "pods", verb) for verb in ("create", "get", "list", "watch", "delete", "patch")
    } | {("", "pods/log", "get"), ("", "events", "list"), ("", "events", "watch")}


# --- The official Airflow Helm chart --------------------------------------------------------

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
}
FREE_FORM = {"config", "triggerer.resources", "secret", "env"}


def _paths(values: Any, prefix: str = "") -> set[str]:
    if not isinstance(values, dict) or prefix in FREE_FORM:
        return {prefix}
    return {
        path for key, value in values.items() for path in _paths(value, f"{prefix}.{key}" if prefix else key)
    }


def test_the_helm_values_use_only_keys_the_chart_documents() -> None:
    values = yaml.safe_load(HELM_VALUES.read_text())
    assert _paths(values) == CHART_KEYS
    for item in values["secret"]:
        assert set(item) == {"envName", "secretName", "secretKey"}
    for item in values["env"]:
        assert set(item) == {"name", "value"}


def test_the_helm_values_deploy_the_provider_as_the_project_expects() -> None:
    from airflow_gpupool.get_provider_info import get_provider_info

    values = yaml.safe_load(HELM_VALUES.read_text())
    assert values["images"]["airflow"]["tag"] == "0.1.0"
    (ledger,) = values["secret"]
    assert ledger["envName"] == "AIRFLOW_CONN_GPUPOOL_DEFAULT"  # the hook's default connection
    accounts = {values[c]["serviceAccount"]["name"] for c in ("workers", "triggerer")}
    assert accounts == {"gpupool-operator"}  # the account docker/kubernetes/rbac.yaml grants
    assert "gpupool-operator" in {
        doc["metadata"]["name"] for _, doc in DOCUMENTS if doc["kind"] == "ServiceAccount"
    }
    options = get_provider_info()["config"]["gpupool"]["options"]
    assert set(values["config"]["gpupool"]) <= set(options)
    assert values["config"]["triggerer"]["capacity"] >= 100
