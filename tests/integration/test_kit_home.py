"""The testing kit keeps Airflow's files out of ``~/airflow`` unless the user chose AIRFLOW_HOME (issue 37).

Each case runs pytest in a subprocess, as a DAG author would, on a project of its own: the
isolation must happen before Airflow is imported, which an in-process test cannot show.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from airflow_gpupool.testkit.home import PREFIX

TINY_DAG = """
from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, task

with DAG("tiny", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):

    @task
    def hello() -> str:
        return "hello"

    hello()
"""

TINY_TEST = """
from __future__ import annotations

from pathlib import Path

from airflow_gpupool.testing import whole_gpu_pool


def test_tiny_dag_runs(gpu_cluster):
    from airflow.configuration import AIRFLOW_HOME

    cluster = gpu_cluster(nodes=[whole_gpu_pool("a100", gpus=1)])
    assert cluster.run_dag("tiny").state == "success"
    assert (Path(AIRFLOW_HOME) / "airflow.db").is_file()


def test_db_only(gpupool_airflow_db):
    from airflow.configuration import AIRFLOW_HOME

    assert (Path(AIRFLOW_HOME) / "airflow.db").is_file()
"""


def _project(root: Path) -> dict[str, str]:
    """Write a DAG author's project under ``root`` and return the environment of their shell."""
    (root / "dags").mkdir()
    (root / "dags" / "tiny.py").write_text(TINY_DAG)
    (root / "tests").mkdir()
    (root / "tests" / "test_tiny.py").write_text(TINY_TEST)
    # A conftest.py importing Airflow at its top: the kit must have acted before pytest reads it.
    (root / "tests" / "conftest.py").write_text("import airflow.configuration  # noqa: F401\n")
    (root / "pytest.ini").write_text("[pytest]\n")  # the project's root, not this repository's
    for name in ("home", "tmp"):
        (root / name).mkdir()
    # The author's shell: none of this session's Airflow settings (tests/conftest.py sets some).
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        HOME=str(root / "home"),
        TMPDIR=str(root / "tmp"),
        AIRFLOW__CORE__DAGS_FOLDER=str(root / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
    )
    return env


def _pytest(root: Path, env: dict[str, str], test: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/test_tiny.py::{test}"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"the author's test failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


def test_without_airflow_home_the_kit_writes_nothing_under_the_home_directory(tmp_path: Path) -> None:
    env = _project(tmp_path)
    _pytest(tmp_path, env, "test_tiny_dag_runs")
    assert not (tmp_path / "home" / "airflow").exists(), "the kit wrote into ~/airflow"
    left = [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith(PREFIX)]
    assert left == [], "the session's temporary AIRFLOW_HOME was not removed"


def test_an_airflow_home_the_user_set_is_used_and_kept(tmp_path: Path) -> None:
    env = _project(tmp_path)
    chosen = tmp_path / "my-airflow"
    env["AIRFLOW_HOME"] = str(chosen)
    _pytest(tmp_path, env, "test_db_only")
    assert (chosen / "airflow.db").is_file()
    assert not (tmp_path / "home" / "airflow").exists()
