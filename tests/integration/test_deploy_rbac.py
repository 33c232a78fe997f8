"""The rendered RBAC against what the code calls: each component may do what it does, and no more.

``tests/kube_api_calls.py`` reads each component's code for its Kubernetes client calls and derives
the permission of each from the client (group, resource, verb; cluster-wide or not). Here, every
overlay's Roles, ClusterRoles and bindings are resolved per ServiceAccount and compared with that:
a call the RBAC lacks fails (the API server would refuse it at run time), and so does a grant no
call needs (least privilege). A component that calls nothing mounts no token.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.kube_api_calls import WITHOUT_CLIENT, Permission, component_calls, module_index, needed
from tests.kustomize_render import OVERLAYS, by_kind, copy_tree, render

#: The code each ServiceAccount runs: root modules (``x.`` is a package's every module) and what
#: they import. The operators' account is the one the Airflow chart gives its workers and
#: triggerer (docker/helm/airflow-values.yaml); the migration Job runs as the namespace's default.
COMPONENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "controller": ("gpupool-controller", ("airflow_gpupool.cli.controller", "airflow_gpupool.controller.")),
    "operators": (
        "gpupool-operator",
        (
            "airflow_gpupool.operators.",
            "airflow_gpupool.triggers.",
            "airflow_gpupool.sensors.",
            "airflow_gpupool.decorators.",
            "airflow_gpupool.hooks.",
            "airflow_gpupool.executor_hook",
        ),
    ),
    "agent": ("gpupool-nvml-agent", ("airflow_gpupool.cli.agent", "airflow_gpupool.agent.")),
    "exporter": ("gpupool-metrics", ("airflow_gpupool.cli.metrics", "airflow_gpupool.metrics.")),
    "ledger-migrate": ("default", ("airflow_gpupool.cli.ledger_init",)),
}
#: The one resource a component uses in its own namespace, wherever the workloads run: the
#: controller's leader-election Lease (``--namespace``, default the pod's own).
OWN_NAMESPACE = {("coordination.k8s.io", "leases")}
NAMESPACE = "airflow"


@cache
def needs(component: str) -> dict[Permission, set[str]]:
    return needed(component_calls(COMPONENTS[component][1]))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    tree = copy_tree(tmp_path_factory.mktemp("deploy"))
    return {overlay: render(tree / "overlays" / overlay) for overlay in OVERLAYS}


def grants(objects: list[dict[str, Any]], account: str) -> set[tuple[str, str, str, str]]:
    """Return ``(group, resource, verb, scope)`` an account is granted; scope is ``*`` or a namespace."""
    roles = {("ClusterRole", n): r for n, r in by_kind(objects, "ClusterRole").items()}
    roles |= {("Role", n): r for n, r in by_kind(objects, "Role").items()}
    found = set()
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for binding in by_kind(objects, kind).values():
            subjects = binding.get("subjects", [])
            if not any(
                s["kind"] == "ServiceAccount" and s["name"] == account and s["namespace"] == NAMESPACE
                for s in subjects
            ):
                continue
            scope = "*" if kind == "ClusterRoleBinding" else binding["metadata"]["namespace"]
            role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
            found |= {
                (group, resource, verb, scope)
                for rule in role["rules"]
                for group in rule["apiGroups"]
                for resource in rule["resources"]
                for verb in rule["verbs"]
            }
    return found


def missing(
    overlay: str, granted: set[tuple[str, str, str, str]], wanted: dict[Permission, set[str]]
) -> list[str]:
    """Return each needed permission the grants lack, with the calls that need it."""
    out = []
    for p, where in sorted(wanted.items()):
        if p.cluster_wide or (overlay == "cluster-wide" and (p.group, p.resource) not in OWN_NAMESPACE):
            scopes = {"*"}  # every namespace: only a ClusterRoleBinding grants it
        else:
            scopes = {"*", p.namespace or NAMESPACE}
        if not any((p.group, p.resource, p.verb, scope) in granted for scope in scopes):
            out.append(f"{p}: {', '.join(sorted(where))}")
    return out


CASES = [(overlay, component) for overlay in OVERLAYS for component in COMPONENTS]


@pytest.mark.parametrize(("overlay", "component"), CASES)
def test_each_component_may_do_what_its_code_calls(
    rendered: dict[str, Any], overlay: str, component: str
) -> None:
    granted = grants(rendered[overlay], COMPONENTS[component][0])
    assert missing(overlay, granted, needs(component)) == []


@pytest.mark.parametrize(("overlay", "component"), CASES)
def test_each_component_may_do_nothing_its_code_does_not(
    rendered: dict[str, Any], overlay: str, component: str
) -> None:
    granted = {(g, r, v) for g, r, v, _ in grants(rendered[overlay], COMPONENTS[component][0])}
    assert granted - {(p.group, p.resource, p.verb) for p in needs(component)} == set()


@pytest.mark.parametrize(
    "component", [c for c in COMPONENTS if c not in ("controller", "operators", "exporter")]
)
def test_a_component_that_calls_nothing_mounts_no_token(rendered: dict[str, Any], component: str) -> None:
    assert needs(component) == {}
    account = COMPONENTS[component][0]
    for objects in rendered.values():
        specs = [
            o["spec"]["template"]["spec"]
            for o in objects
            if o["kind"] in ("Deployment", "DaemonSet", "Job")
            and o["spec"]["template"]["spec"].get("serviceAccountName", "default") == account
        ]
        assert specs and all(spec["automountServiceAccountToken"] is False for spec in specs)
        assert grants(objects, account) == set()


def test_a_removed_rule_is_caught(rendered: dict[str, Any]) -> None:
    objects = [dict(o) for o in rendered["single-namespace"]]
    role = by_kind(objects, "ClusterRole")["gpupool-controller-cluster"]
    pods = next(rule for rule in role["rules"] if rule["resources"] == ["pods"])
    planted = {
        **role,
        "rules": [
            {**r, "verbs": [v for v in r["verbs"] if v != "watch"]} if r is pods else r for r in role["rules"]
        ],
    }
    objects = [planted if o is role else o for o in objects]
    assert missing("single-namespace", grants(objects, "gpupool-controller"), needs("controller")) == [
        "watch pods (core) in every namespace: airflow_gpupool.controller.pod_watch: list_pod_for_all_namespaces"
    ]


def test_a_namespaced_grant_does_not_cover_the_cluster_wide_overlay(rendered: dict[str, Any]) -> None:
    # The single-namespace overlay's RoleBindings do not let the operators launch pods elsewhere.
    granted = grants(rendered["single-namespace"], "gpupool-operator")
    assert "create pods (core) in a namespace: " in "\n".join(
        missing("cluster-wide", granted, needs("operators"))
    )


def test_the_scan_finds_the_calls_it_must() -> None:
    controller, operators = needs("controller"), needs("operators")
    assert Permission("coordination.k8s.io", "leases", "update", False) in controller
    assert Permission("", "pods", "list", True) in controller  # list_pod_for_all_namespaces
    # The pod watch's ResourceClaims: CustomObjectsApi reads with get_*, lists cluster-wide.
    assert Permission("resource.k8s.io", "resourceclaims", "get", False) in controller
    assert Permission("resource.k8s.io", "resourceclaims", "list", True) in controller
    assert Permission("scheduling.k8s.io", "priorityclasses", "get", True) in controller
    # A namespace the code names is the one needed: a node's Events go to `default`.
    assert Permission("", "events", "create", False, "default") in controller
    # KubernetesPodOperator's pod manager, GpuJobOperator through the provider's hook, the dra binding.
    assert Permission("", "pods", "create", False) in operators
    assert Permission("", "pods/log", "get", False) in operators
    assert Permission("batch", "jobs", "create", False) in operators
    assert Permission("resource.k8s.io", "resourceclaims", "create", False) in operators


def test_the_packages_left_out_of_the_scan_build_no_client() -> None:
    # Without an import of the client, a module can only call one it is handed.
    for module, path in module_index().items():
        if module.startswith(WITHOUT_CLIENT):
            tree = ast.parse(Path(path).read_text())
            imported = {alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names}
            imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            assert not {m for m in imported if m.split(".")[0] in ("kubernetes", "kubernetes_asyncio")}, (
                module
            )
