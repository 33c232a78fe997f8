"""A real S3 API for the checkpoint tests: moto's server in a process of its own, on a free port.

moto runs from its own virtualenv (``make moto`` builds ``.venv-moto`` from
``tests/moto-requirements.txt``): its Flask server and boto3 stay out of the project's pins, and
the tests only speak S3 over HTTP to it, as they would to MinIO or AWS. ``GPUPOOL_MOTO_SERVER`` names the ``moto_server``
program (the Makefile sets it). Under ``CI=true`` a missing or dead server fails the tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.multiworker.harness import free_port
from tests.skips import skip_or_fail

ROOT = Path(__file__).resolve().parents[1]
MOTO_SERVER_ENV = "GPUPOOL_MOTO_SERVER"
S3_CONN_ID = "gpupool_s3"
BUCKET = "gpupool-checkpoints"
# moto accepts any key; these say plainly that they are not real ones.
ACCESS_KEY, SECRET_KEY, REGION = "testing-access-key", "testing-secret-key", "us-east-1"
START_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class MotoS3:
    """A running moto S3 server with one bucket, and the Airflow connection that reaches it.

    :param endpoint_url: the server's URL
    :param bucket: the bucket the session created
    :param conn_id: the Airflow connection (``aws``) for ObjectStoragePath
    """

    endpoint_url: str
    bucket: str
    conn_id: str

    def url(self, *parts: str) -> str:
        """Return ``s3://<bucket>/<parts...>``."""
        return "/".join([f"s3://{self.bucket}", *parts])


def moto_server_program() -> Path:
    """Return the ``moto_server`` program: ``$GPUPOOL_MOTO_SERVER``, else ``.venv-moto``'s."""
    return Path(os.environ.get(MOTO_SERVER_ENV) or ROOT / ".venv-moto" / "bin" / "moto_server")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer means the server is up
    except OSError:
        return False


def _wait_until_up(server: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not _answers(url):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            pytest.fail(f"moto_server did not answer at {url}; its log:\n{log.read_text()[-2000:]}")
        time.sleep(0.1)


def aws_connection(endpoint_url: str) -> str:
    """Return the ``AIRFLOW_CONN_*`` JSON of an ``aws`` connection to ``endpoint_url``."""
    extra = {"endpoint_url": endpoint_url, "region_name": REGION}
    return json.dumps({"conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY, "extra": extra})


def _create_bucket(endpoint_url: str, bucket: str) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
    )
    client.create_bucket(Bucket=bucket)


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    """Start moto's S3 server, create the bucket, and point connection and environment at it.

    The ``gpupool_s3`` Airflow connection serves ObjectStoragePath (operator, sensor, trigger);
    the ``AWS_*`` variables serve plain fsspec clients, as the emulated training container.
    """
    try:
        import airflow.providers.amazon  # noqa: F401  (ObjectStoragePath's s3:// filesystem)
    except ImportError:
        skip_or_fail(
            "the s3 extra is missing: pip install -c constraints.txt -e '.[s3]'",
            what="the s3:// checkpoint tests",
        )
    program = moto_server_program()
    if not os.access(program, os.X_OK):
        skip_or_fail(f"{program} is missing: run `make moto`", what="the s3:// checkpoint tests")
    port = free_port()
    endpoint_url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [str(program), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        _wait_until_up(server, endpoint_url, log)
        _create_bucket(endpoint_url, BUCKET)
        env = {
            f"AIRFLOW_CONN_{S3_CONN_ID.upper()}": aws_connection(endpoint_url),
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL_S3": endpoint_url,
        }
        saved = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        try:
            yield MotoS3(endpoint_url=endpoint_url, bucket=BUCKET, conn_id=S3_CONN_ID)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
