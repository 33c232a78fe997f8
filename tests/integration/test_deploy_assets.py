"""The deployment assets in ``docker/``: the image and the compose stack.

Docker is not available to the tests: the files are parsed and checked for structure and exact
names (services, volumes, connections); the compose stack's checkpoint settings are tried against
a real S3 API (moto). The monitoring assets (alert rules, dashboard) are ``test_docker_assets.py``'s;
the Kubernetes files (``deploy/kustomize``) are ``test_kustomize.py``'s and ``test_deploy_rbac.py``'s.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.s3_fixtures import MotoS3

DOCKER = Path(__file__).resolve().parents[2] / "docker"


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
