"""The deployment assets in ``docker/``: the image, the compose stack and the Kubernetes manifests.

Docker and a cluster are not available to the tests: the files are parsed and checked for
structure and exact names (services, volumes, connections, RBAC verbs, priority classes); the
compose stack's checkpoint settings are tried against a real S3 API (moto). The monitoring assets
(alert rules, dashboard) are ``test_docker_assets.py``'s.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_gpupool import settings
from airflow_gpupool.cli import build_parser
from airflow_gpupool.operators.pod_spec import GPU_TOLERATION
from tests.s3_fixtures import MotoS3

DOCKER = Path(__file__).resolve().parents[2] / "docker"
KUBERNETES = DOCKER / "kubernetes"


# --- Image and compose stack --------------------------------------------------------------


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", "", (DOCKER / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0], line.split(None, 1)[1]) for line in lines]


def test_dockerfile() -> None:
    instructions = _dockerfile_instructions()
    assert instructions[0] == ("FROM", "apache/airflow:3.3.2-python3.11")
    assert [arg for op, arg in instructions if op == "COPY"] == [
        "--chown=airflow:root constraints.txt ./constraints.txt",
        "--chown=airflow:root pyproject.toml README.md ./",
        "--chown=airflow:root airflow_gpupool ./airflow_gpupool",
    ]
    (run,) = [arg for op, arg in instructions if op == "RUN"]
    # With the s3 extra: ObjectStoragePath reads the compose stack's s3:// checkpoints.
    assert run.startswith('pip install --no-cache-dir -c constraints.txt ".[s3]" ')
    assert run.endswith('python -c "import s3fs, airflow.providers.amazon.aws.fs.s3"')
    assert ("USER", "airflow") in instructions


def test_image_matches_the_pinned_airflow() -> None:
    pins = dict(
        line.split("==", 1)
        for line in (DOCKER.parent / "constraints.txt").read_text().splitlines()
        if "==" in line
    )
    base = _dockerfile_instructions()[0][1]
    assert base == f"apache/airflow:{pins['apache-airflow']}-python3.11"


def test_dockerignore_sends_only_the_package() -> None:
    lines = [
        line
        for line in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
        if line and line[0] != "#"
    ]
    assert lines[:5] == ["*", "!constraints.txt", "!pyproject.toml", "!README.md", "!airflow_gpupool/"]


LEDGER_URL = "postgresql://gpupool:gpupool@postgres:5432/gpupool"
AIRFLOW_SERVICES = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_compose_services() -> None:
    services = _compose()["services"]
    assert set(services) == {
        "postgres",
        "airflow-init",
        *AIRFLOW_SERVICES,
        "gpupool-controller",
        "object-store",
        "object-store-init",
        "gpupool-metrics",
        "prometheus",
    }
    # PostgreSQL is not published on the host's 5432 (a local server may hold it), and only on loopback.
    assert services["postgres"]["ports"] == ["127.0.0.1:${GPUPOOL_POSTGRES_PORT:-15432}:5432"]
    assert services["object-store"]["image"].startswith("minio/minio:")
    (script,) = services["object-store-init"]["entrypoint"][2:]
    assert "mc mb --ignore-existing local/gpupool-checkpoints" in script
    assert services["postgres"]["image"] == "postgres:16"
    assert services["postgres"]["healthcheck"]["test"] == ["CMD", "pg_isready", "-U", "airflow"]
    assert services["prometheus"]["image"].startswith("prom/prometheus:v3.")
    assert services["prometheus"]["profiles"] == services["gpupool-metrics"]["profiles"] == ["monitoring"]


@pytest.mark.parametrize(
    "service", ["airflow-init", *AIRFLOW_SERVICES, "gpupool-controller", "gpupool-metrics"]
)
def test_compose_airflow_service(service: str) -> None:
    spec = _compose()["services"][service]
    assert spec["image"] == "airflow-gpupool:0.1.0"
    assert spec["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
    env = spec["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert (
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        == "postgresql+psycopg2://airflow:airflow@postgres:5432/airflow"
    )
    assert json.loads(env["AIRFLOW_CONN_GPUPOOL_DEFAULT"]) == {
        "conn_type": "gpupool",
        "extra": {"ledger_url": LEDGER_URL},
    }
    assert env["GPUPOOL_LEDGER_URL"] == LEDGER_URL
    # The mounted kubeconfig is the one used: nothing falls back to in-cluster configuration.
    assert env["KUBECONFIG"] == "/home/airflow/.kube/config"
    # Checkpoints on the shared object store: ObjectStoragePath through the aws connection the
    # example DAGs name; plain fsspec clients through botocore's variables, to the same store.
    assert env["GPUPOOL_CHECKPOINT_ROOT"] == "s3://gpupool-checkpoints"
    assert env["GPUPOOL_CHECKPOINT_CONN_ID"] == "gpupool_s3"
    minio = _compose()["services"]["object-store"]["environment"]
    assert json.loads(env["AIRFLOW_CONN_GPUPOOL_S3"]) == {
        "conn_type": "aws",
        "login": minio["MINIO_ROOT_USER"],
        "password": minio["MINIO_ROOT_PASSWORD"],
        "extra": {"endpoint_url": "http://object-store:9000", "region_name": "us-east-1"},
    }
    assert env["AWS_ENDPOINT_URL"] == "http://object-store:9000"
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (
        minio["MINIO_ROOT_USER"],
        minio["MINIO_ROOT_PASSWORD"],
    )
    assert spec["volumes"] == [
        "../dags:/opt/airflow/dags:ro",
        "../examples:/opt/airflow/gpupool-examples:ro",
        "${KUBECONFIG_DIR:-~/.kube}:/home/airflow/.kube:ro",
    ]
    if service == "airflow-init":
        assert spec["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    else:
        assert spec["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "airflow-init": {"condition": "service_completed_successfully"},
            "object-store-init": {"condition": "service_completed_successfully"},
        }
    if service in AIRFLOW_SERVICES:
        assert spec["command"] == AIRFLOW_SERVICES[service]


def test_compose_checkpoint_settings_work_against_an_s3_api(
    moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stack's checkpoint root and connection, pointed at moto instead of MinIO, read and write."""
    from airflow_gpupool.checkpoints import CheckpointStore, manifest_bytes

    env = _compose()["services"]["airflow-scheduler"]["environment"]
    conn_id = env["GPUPOOL_CHECKPOINT_CONN_ID"]
    connection = json.loads(env[f"AIRFLOW_CONN_{conn_id.upper()}"])
    connection["extra"]["endpoint_url"] = moto_s3.endpoint_url  # the only change: where MinIO would be
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name)  # the connection alone must reach the store
    (init,) = _compose()["services"]["object-store-init"]["entrypoint"][2:]
    assert env["GPUPOOL_CHECKPOINT_ROOT"] == f"s3://{moto_s3.bucket}"
    assert f"local/{moto_s3.bucket}" in init

    root = f"{env['GPUPOOL_CHECKPOINT_ROOT']}/compose-check/{uuid.uuid4().hex}"
    store = CheckpointStore(root, conn_id=conn_id)
    store.fs.pipe_file(f"{store.root}/step-000001/manifest.json", manifest_bytes(1, {"loss": 0.4}))

    newest = store.newest()
    assert newest is not None and (newest.step, newest.location) == (1, f"{root}/step-000001")


def test_compose_init_migrates_both_databases() -> None:
    services = _compose()["services"]
    bash, flag, script = services["airflow-init"]["command"]
    assert (bash, flag) == ("bash", "-c")
    assert script == 'airflow db migrate && gpupool ledger init --url "$$GPUPOOL_LEDGER_URL"'
    assert services["airflow-init"]["restart"] == "no"
    assert (
        services["gpupool-metrics"]["command"][-1] == "exec gpupool metrics serve --bind 0.0.0.0 --port 9464"
    )
    controller = services["gpupool-controller"]["command"][-1]
    assert controller == "exec gpupool controller run --sync-interval 60 --reconcile-interval 30"


def test_compose_ledger_database_and_volumes() -> None:
    compose = _compose()
    postgres = compose["services"]["postgres"]
    assert postgres["volumes"] == [
        "postgres-data:/var/lib/postgresql/data",
        "./postgres/init-ledger.sql:/docker-entrypoint-initdb.d/10-init-ledger.sql:ro",
    ]
    assert set(compose["volumes"]) == {"postgres-data", "object-store-data"}
    sql = (DOCKER / "postgres" / "init-ledger.sql").read_text()
    assert "CREATE ROLE gpupool LOGIN PASSWORD 'gpupool';" in sql
    assert "CREATE DATABASE gpupool OWNER gpupool;" in sql
    assert compose["services"]["prometheus"]["volumes"] == [
        "./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro",
        "./prometheus/rules.yaml:/etc/prometheus/rules.yaml:ro",
    ]
    for path in (
        "../dags",
        "../examples/inventory.yaml",
        "./postgres/init-ledger.sql",
        "./prometheus/prometheus.yml",
        "./prometheus/rules.yaml",
    ):
        assert (DOCKER / path).exists(), path


# --- Kubernetes manifests -----------------------------------------------------------------


class _Response:
    def __init__(self, obj: dict[str, Any]) -> None:
        self.data = json.dumps(obj)


MODELS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("scheduling.k8s.io/v1", "PriorityClass"): "V1PriorityClass",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("apps/v1", "Deployment"): "V1Deployment",
}


def _manifest(name: str) -> dict[tuple[str, str], Any]:
    """Load one manifest file into Kubernetes client models, keyed by (kind, name)."""
    from kubernetes.client import ApiClient

    client = ApiClient()
    objects: dict[tuple[str, str], Any] = {}
    for doc in yaml.safe_load_all((KUBERNETES / name).read_text()):
        model = MODELS[(doc["apiVersion"], doc["kind"])]
        obj = client.deserialize(_Response(doc), model)
        # A misspelled field would be dropped silently: the model must give back the document.
        assert client.sanitize_for_serialization(obj) == doc
        objects[(doc["kind"], doc["metadata"]["name"])] = obj
    return objects


def test_manifest_files() -> None:
    assert sorted(p.name for p in KUBERNETES.iterdir()) == [
        "namespace.yaml",
        "nvml-agent-daemonset.yaml",
        "pool-controller.yaml",
        "pool-metrics.yaml",
        "priority-classes.yaml",
        "prometheus-operator",
        "rbac.yaml",
    ]
    # `kubectl apply -f docker/kubernetes/` goes in file-name order: the namespace first.
    assert sorted(p.name for p in KUBERNETES.iterdir())[0] == "namespace.yaml"
    assert list(_manifest("namespace.yaml")) == [("Namespace", "airflow")]


def test_priority_classes_match_the_default_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW__GPUPOOL__WORKLOAD_PRIORITY_CLASSES", raising=False)
    monkeypatch.setattr(settings, "_from_airflow_config", lambda option: None)
    classes = {name: obj for (_, name), obj in _manifest("priority-classes.yaml").items()}
    assert (
        set(classes)
        == set(settings.workload_priority_classes().values())
        == {"gpupool-training", "gpupool-inference"}
    )
    inference, training = classes["gpupool-inference"], classes["gpupool-training"]
    assert (inference.value, inference.preemption_policy) == (1_000_000, "PreemptLowerPriority")
    assert (training.value, training.preemption_policy) == (100_000, "Never")
    for pc in classes.values():
        assert pc.global_default is False
        assert pc.value < 1_000_000_000  # above that is reserved for system classes
        assert pc.description


def _verbs(rules: list[Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for rule in rules:
        assert rule.api_groups == [""]
        for resource in rule.resources:
            out[resource] = rule.verbs
    return out


def test_rbac() -> None:
    objects = _manifest("rbac.yaml")
    assert sorted(objects) == [
        ("ClusterRole", "gpupool-operator-cluster"),
        ("ClusterRoleBinding", "gpupool-operator-cluster"),
        ("Role", "gpupool-operator"),
        ("RoleBinding", "gpupool-operator"),
        ("ServiceAccount", "gpupool-operator"),
    ]
    account = objects[("ServiceAccount", "gpupool-operator")]
    role = objects[("Role", "gpupool-operator")]
    assert _verbs(role.rules) == {
        "pods": ["create", "get", "list", "watch", "delete", "patch"],
        "pods/log": ["get"],
        "events": ["list", "watch"],
    }
    assert _verbs(objects[("ClusterRole", "gpupool-operator-cluster")].rules) == {
        "nodes": ["get", "list"],
        "pods": ["list"],
    }
    for kind, role_kind in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        binding = next(obj for (k, _), obj in objects.items() if k == kind)
        assert (binding.role_ref.kind, binding.role_ref.name) == (
            role_kind,
            "gpupool-operator" if role_kind == "Role" else "gpupool-operator-cluster",
        )
        (subject,) = binding.subjects
        assert (subject.kind, subject.name, subject.namespace) == (
            "ServiceAccount",
            account.metadata.name,
            account.metadata.namespace,
        )
    # The Role and its binding live where the example DAG launches its pods.
    example_dag = (DOCKER.parent / "dags" / "example_gpu_pod.py").read_text()
    assert f'namespace="{role.metadata.namespace}"' in example_dag
    assert objects[("RoleBinding", "gpupool-operator")].metadata.namespace == role.metadata.namespace


def test_nvml_agent_daemonset() -> None:
    objects = _manifest("nvml-agent-daemonset.yaml")
    assert sorted(objects) == [("DaemonSet", "gpupool-nvml-agent"), ("ServiceAccount", "gpupool-nvml-agent")]
    daemonset = objects[("DaemonSet", "gpupool-nvml-agent")]
    spec = daemonset.spec.template.spec
    assert daemonset.spec.selector.match_labels.items() <= daemonset.spec.template.metadata.labels.items()
    assert spec.node_selector == {"nvidia.com/gpu.present": "true"}
    (toleration,) = spec.tolerations
    assert (toleration.key, toleration.operator, toleration.effect) == (
        GPU_TOLERATION.key,
        GPU_TOLERATION.operator,
        GPU_TOLERATION.effect,
    )
    assert spec.service_account_name == "gpupool-nvml-agent"
    (container,) = spec.containers
    assert container.command == ["gpupool", "agent", "run"]
    env = {e.name: e for e in container.env}
    ledger = env["GPUPOOL_LEDGER_URL"].value_from.secret_key_ref
    assert (ledger.name, ledger.key) == ("gpupool-ledger", "url")
    assert env["NODE_NAME"].value_from.field_ref.field_path == "spec.nodeName"
    assert container.resources.requests == {"cpu": "50m", "memory": "128Mi"}
    assert container.resources.limits == {"cpu": "200m", "memory": "256Mi"}
    # The agent watches GPUs through NVML; requesting one would take it away from the pool.
    assert not any(key.startswith("nvidia.com/") for key in container.resources.limits)
    # The real agent (issue 17): its own command line, the NVIDIA runtime, the host's pids.
    assert container.args == ["--node", "$(NODE_NAME)", "--interval", "30"]
    parsed = build_parser().parse_args(["agent", "run", "--node", "n1", "--interval", "30"])
    assert (parsed.node, parsed.interval) == ("n1", 30.0)
    assert spec.runtime_class_name == "nvidia"
    assert spec.host_pid is True  # process -> cgroup -> pod uid needs the host's /proc
    assert not container.security_context.privileged and container.security_context.capabilities.drop == [
        "ALL"
    ]
    assert "PLACEHOLDER" not in (KUBERNETES / "nvml-agent-daemonset.yaml").read_text()


def _rules_by_group(rules: list[Any]) -> dict[tuple[str, str], list[str]]:
    return {
        (group, resource): rule.verbs
        for rule in rules
        for group in rule.api_groups
        for resource in rule.resources
    }


def test_controller_deployment() -> None:
    from airflow_gpupool.cli import build_parser

    objects = _manifest("pool-controller.yaml")
    assert sorted(objects) == [
        ("ClusterRole", "gpupool-controller"),
        ("ClusterRoleBinding", "gpupool-controller"),
        ("Deployment", "gpupool-controller"),
        ("Role", "gpupool-controller-leader-election"),
        ("RoleBinding", "gpupool-controller-leader-election"),
        ("ServiceAccount", "gpupool-controller"),
    ]
    account = objects[("ServiceAccount", "gpupool-controller")]
    assert _rules_by_group(objects[("ClusterRole", "gpupool-controller")].rules) == {
        ("", "nodes"): ["list"],
        ("", "pods"): ["get", "list", "watch", "patch", "delete"],
        ("", "events"): ["create"],
        ("scheduling.k8s.io", "priorityclasses"): ["get"],
    }
    role = objects[("Role", "gpupool-controller-leader-election")]
    assert _rules_by_group(role.rules) == {("coordination.k8s.io", "leases"): ["get", "create", "update"]}
    for kind, role_kind, role_name in (
        ("ClusterRoleBinding", "ClusterRole", "gpupool-controller"),
        ("RoleBinding", "Role", "gpupool-controller-leader-election"),
    ):
        binding = next(obj for (k, _), obj in objects.items() if k == kind)
        assert (binding.role_ref.kind, binding.role_ref.name) == (role_kind, role_name)
        (subject,) = binding.subjects
        assert (subject.kind, subject.name, subject.namespace) == (
            "ServiceAccount",
            account.metadata.name,
            account.metadata.namespace,
        )
    deployment = objects[("Deployment", "gpupool-controller")]
    assert deployment.spec.replicas == 2
    assert deployment.metadata.namespace == role.metadata.namespace == account.metadata.namespace
    assert deployment.spec.selector.match_labels.items() <= deployment.spec.template.metadata.labels.items()
    spec = deployment.spec.template.spec
    assert spec.service_account_name == "gpupool-controller"
    (container,) = spec.containers
    assert container.command == ["gpupool", "controller", "run"]
    # The flags are the command's own: the parser accepts them.
    args = build_parser().parse_args([*container.command[1:], *container.args])
    assert (args.sync_interval, args.reconcile_interval, args.lease_duration) == (60, 30, 15)
    env = {e.name: e for e in container.env}
    ledger = env["GPUPOOL_LEDGER_URL"].value_from.secret_key_ref
    assert (ledger.name, ledger.key) == ("gpupool-ledger", "url")
    # The Lease's namespace: the pod's own (cli.controller.default_namespace reads POD_NAMESPACE).
    assert env["POD_NAMESPACE"].value_from.field_ref.field_path == "metadata.namespace"
    assert not any(key.startswith("nvidia.com/") for key in container.resources.limits)
