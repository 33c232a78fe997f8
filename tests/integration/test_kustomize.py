"""``deploy/kustomize``: every overlay rendered by ``kubectl kustomize`` and validated strictly.

``kubernetes-validate`` carries the API server's OpenAPI schemas, so each rendered object is
checked offline, and strictly: an unknown field fails. The components are then checked against
the code they run: the command lines parse with ``gpupool``'s own parser, the probes hit the health
server's paths, one image and one ledger Secret everywhere, the Airflow chart's values included.
What RBAC the code needs is ``test_deploy_rbac.py``'s.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_gpupool import settings
from airflow_gpupool.cli import build_parser
from airflow_gpupool.cli.ledger import cmd_ledger_init
from airflow_gpupool.operators.pod.pod_spec import GPU_TOLERATION
from tests.kustomize_render import KUSTOMIZE, OVERLAYS, ROOT, by_kind, copy_tree, render

KUBERNETES_VERSION = "1.30.0"  # the level the emulator serves; the manifests use nothing newer
HELM_VALUES = ROOT / "docker" / "helm" / "airflow-values.yaml"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tree(tmp_path_factory.mktemp("deploy"))


@pytest.fixture(scope="module")
def rendered(tree: Path) -> dict[str, list[dict[str, Any]]]:
    return {overlay: render(tree / "overlays" / overlay) for overlay in OVERLAYS}


def containers(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Yield ``(pod spec, container)`` of every workload."""
    for o in objects:
        if o["kind"] in ("Deployment", "DaemonSet", "Job"):
            spec = o["spec"]["template"]["spec"]
            for container in spec["containers"]:
                yield spec, container


def test_the_overlays_are_the_two_scopes() -> None:
    assert OVERLAYS == ["cluster-wide", "single-namespace"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_validates_strictly(rendered: dict[str, Any], overlay: str) -> None:
    import kubernetes_validate

    objects = rendered[overlay]
    assert len(objects) >= 20
    for o in objects:
        kubernetes_validate.validate(o, KUBERNETES_VERSION, strict=True)
        # No Namespace: the Airflow release shares it, and `kubectl delete -k` must leave it.
        assert o["kind"] != "Namespace"
        if o["kind"] not in ("PriorityClass", "ClusterRole", "ClusterRoleBinding"):
            assert o["metadata"]["namespace"] == "airflow", o["metadata"]["name"]
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "airflow-gpupool"


def test_a_wrong_object_is_caught() -> None:
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
    with pytest.raises(kubernetes_validate.ValidationError, match="automount"):
        kubernetes_validate.validate(unknown, KUBERNETES_VERSION, strict=True)


def test_the_overlays_differ_only_in_the_scope_of_the_workloads_bindings(rendered: dict[str, Any]) -> None:
    def without_workload_bindings(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [o for o in objects if not o["metadata"]["name"].endswith("-workloads") or "rules" in o]

    single, wide = rendered["single-namespace"], rendered["cluster-wide"]
    assert without_workload_bindings(single) == without_workload_bindings(wide)
    names = {"gpupool-controller-workloads", "gpupool-operator-workloads"}
    assert set(by_kind(single, "RoleBinding")) >= names and not names & set(
        by_kind(single, "ClusterRoleBinding")
    )
    assert set(by_kind(wide, "ClusterRoleBinding")) >= names and not names & set(by_kind(wide, "RoleBinding"))


def test_one_image_set_once_and_the_helm_values_agree(rendered: dict[str, Any]) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    image = f"airflow-gpupool:{version}"
    for objects in rendered.values():
        assert {c["image"] for _, c in containers(objects)} == {image}
    # Set in one place: every container of the base names the image, the tag is only in `images:`.
    for path in (KUSTOMIZE / "base").glob("*.yaml"):
        assert "airflow-gpupool:" not in path.read_text(), path.name
    values = yaml.safe_load(HELM_VALUES.read_text())["images"]["airflow"]
    assert f"{values['repository']}:{values['tag']}" == image
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    assert compose["x-airflow-common"]["image"] == image


def test_one_ledger_secret_read_by_every_component_and_by_airflow(rendered: dict[str, Any]) -> None:
    for objects in rendered.values():
        (secret,) = by_kind(objects, "Secret").values()
        assert secret["metadata"]["name"] == "gpupool-ledger" and set(secret["data"]) == {"url"}
        url = base64.b64decode(secret["data"]["url"]).decode()
        assert url == "postgresql://gpupool:PASSWORD@ledger-host:5432/gpupool"  # the example, in the copy
        refs = [
            (env["name"], env["valueFrom"]["secretKeyRef"])
            for _, c in containers(objects)
            for env in c.get("env", [])
            if "secretKeyRef" in env.get("valueFrom", {})
        ]
        assert len(refs) == 4  # controller, agent, exporter, migration
        assert {(name, ref["name"], ref["key"]) for name, ref in refs} == {
            ("GPUPOOL_LEDGER_URL", "gpupool-ledger", "url")
        }
    (airflow,) = yaml.safe_load(HELM_VALUES.read_text())["secret"]
    assert (airflow["secretName"], airflow["secretKey"]) == ("gpupool-ledger", "url")


def test_the_ledger_env_file_is_never_committed() -> None:
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "deploy/kustomize/base/ledger.env" in ignored
    example = (KUSTOMIZE / "base" / "ledger.env.example").read_text()
    assert "url=postgresql://gpupool:PASSWORD@" in example


def _probe_port(container: dict[str, Any], probe: str) -> Any:
    handler = container[probe]
    return (handler.get("httpGet") or handler.get("tcpSocket"))["port"]


def _health(container: dict[str, Any], args: Any) -> None:
    """The probes hit the health server the command line starts, on its paths."""
    (port,) = [p for p in container["ports"] if p["name"] == "health"]
    assert args.health_port == port["containerPort"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_the_controller_is_leader_elected_probed_and_kept_through_a_drain(rendered: dict[str, Any]) -> None:
    objects = rendered["single-namespace"]
    deployment = by_kind(objects, "Deployment")["gpupool-controller"]
    assert deployment["spec"]["replicas"] == 2
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "gpupool-controller"
    (container,) = spec["containers"]
    assert container["command"] == ["gpupool", "controller", "run"]
    args = build_parser().parse_args([*container["command"][1:], *container["args"]])
    assert (args.sync_interval, args.reconcile_interval, args.lease_duration) == (60, 30, 15)
    _health(container, args)
    env = {e["name"]: e for e in container["env"]}
    # The Lease's namespace: the pod's own (cli.controller.default_namespace reads POD_NAMESPACE).
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    (pdb,) = by_kind(objects, "PodDisruptionBudget").values()
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_node_agent_runs_on_gpu_nodes_with_a_priority_class_of_its_own(rendered: dict[str, Any]) -> None:
    objects = rendered["single-namespace"]
    daemonset = by_kind(objects, "DaemonSet")["gpupool-nvml-agent"]
    spec = daemonset["spec"]["template"]["spec"]
    assert (
        daemonset["spec"]["selector"]["matchLabels"].items()
        <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    )
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {
        "key": GPU_TOLERATION.key,
        "operator": GPU_TOLERATION.operator,
        "effect": GPU_TOLERATION.effect,
    } in spec["tolerations"]
    # Admitted outside kube-system: a class of its own, not system-node-critical.
    priority_class = by_kind(objects, "PriorityClass")[spec["priorityClassName"]]
    assert not spec["priorityClassName"].startswith("system-")
    assert priority_class["value"] <= 1_000_000_000  # above that is reserved for the system classes
    workloads = [
        by_kind(objects, "PriorityClass")[n]["value"] for n in ("gpupool-training", "gpupool-inference")
    ]
    assert priority_class["value"] > max(workloads)
    (container,) = spec["containers"]
    assert container["command"] == ["gpupool", "agent", "run"]
    args = build_parser().parse_args([*container["command"][1:], *container["args"]])
    assert (args.node, args.interval) == ("$(NODE_NAME)", 30.0)
    _health(container, args)
    assert spec["hostPID"] is True and spec["runtimeClassName"] == "nvidia"
    # The agent watches GPUs through NVML; requesting one would take it away from the pool.
    assert not any(key.startswith("nvidia.com/") for key in container["resources"]["limits"])
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_the_exporter_and_its_service(rendered: dict[str, Any]) -> None:
    objects = rendered["single-namespace"]
    deployment = by_kind(objects, "Deployment")["gpupool-metrics"]
    service = by_kind(objects, "Service")["gpupool-metrics"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args([*container["command"][1:], *container["args"]])
    assert (args.bind, args.port) == ("0.0.0.0", 9464)
    assert container["readinessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert _probe_port(container, "livenessProbe") == "metrics"
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {p["name"] for p in container["ports"]}


def test_the_migration_job_runs_the_ledger_s_own_init(rendered: dict[str, Any]) -> None:
    job = by_kind(rendered["single-namespace"], "Job")["gpupool-ledger-migrate"]
    spec = job["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert build_parser().parse_args(container["command"][1:]).func is cmd_ledger_init
    assert spec["restartPolicy"] == "OnFailure" and job["spec"]["backoffLimit"] >= 3
    assert spec["automountServiceAccountToken"] is False


def test_the_migration_job_s_command_migrates_a_real_ledger_twice(
    rendered: dict[str, Any], ledger_url: str
) -> None:
    # The Job's command line and environment as the kubelet runs them, the Secret's URL replaced by
    # a fresh database of each backend: the schema is made, then found up to date.
    job = by_kind(rendered["single-namespace"], "Job")["gpupool-ledger-migrate"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    (env,) = container["env"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "gpupool-ledger", "key": "url"}
    command = [sys.executable, "-m", "airflow_gpupool.cli", *container["command"][1:]]
    environ = {**os.environ, "PYTHONPATH": str(ROOT), env["name"]: ledger_url}
    first = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and "applied schema v1," in first.stdout, first.stderr
    again = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "already up to date" in again.stdout, again.stderr


def test_priority_classes_match_the_default_setting(
    rendered: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIRFLOW__GPUPOOL__WORKLOAD_PRIORITY_CLASSES", raising=False)
    monkeypatch.setattr(settings, "_from_airflow_config", lambda option: None)
    classes = by_kind(rendered["single-namespace"], "PriorityClass")
    assert set(settings.workload_priority_classes().values()) == {"gpupool-training", "gpupool-inference"}
    assert set(classes) == {"gpupool-training", "gpupool-inference", "gpupool-node-agent"}
    inference, training = classes["gpupool-inference"], classes["gpupool-training"]
    assert (inference["value"], inference["preemptionPolicy"]) == (1_000_000, "PreemptLowerPriority")
    assert (training["value"], training["preemptionPolicy"]) == (100_000, "Never")
    assert all(pc["globalDefault"] is False and pc["description"] for pc in classes.values())


def test_the_prometheus_operator_component_scrapes_the_exporter(tree: Path) -> None:
    mine = tree / "overlays" / "with-monitoring"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "namespace": "ml",
                "resources": ["../single-namespace"],
                "components": ["../../components/prometheus-operator"],
            }
        )
    )
    objects = render(mine)
    (monitor,) = by_kind(objects, "ServiceMonitor").values()
    service = by_kind(objects, "Service")["gpupool-metrics"]
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"] == "ml"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (
        endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["path"] == "/metrics"
    )
    # An overlay of one's own moves every object, the RBAC's subjects included, to its namespace.
    assert {o["metadata"].get("namespace") for o in objects} == {None, "ml"}
    subjects = [s for o in objects for s in o.get("subjects", [])]
    assert subjects and {s["namespace"] for s in subjects} == {"ml"}
