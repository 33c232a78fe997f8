"""The package as users install it: the sdist and wheel build, pass ``twine check``, carry their
data files, and the wheel installed (not editable) into a clean venv with its runtime dependencies
and the ``testing`` extra runs an example DAG under ``dag.test()`` against the emulator.

The clean venv installs through pip with ``constraints.txt`` (the pins CI uses). Measured on the
2-core machine: 91 s for the three tests (82 s of it the venv and the DAG run); a first run on a
loaded machine with nothing downloaded yet took 7.7 min. ``uv`` is not on these machines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from tests.skips import skip_or_fail

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

# What the code opens at run time besides its modules: a wheel without them imports but fails later.
PACKAGE_DATA = (
    "airflow_gpupool/py.typed",
    "airflow_gpupool/ledger/postgres/sql/gpupool_take.sql",
    "airflow_gpupool/ledger/postgres/sql/gpupool_give_back.sql",
    "airflow_gpupool/ledger/postgres/sql/gpupool_wait.sql",
    "airflow_gpupool/plugins/static/gpupool.css",
    "airflow_gpupool/plugins/static/gpupool.js",
    "airflow_gpupool/data/example-inventory.yaml",
)

# The test the clean venv runs, as a DAG author would write it: the kit's fixtures come from the
# installed wheel's pytest11 entry point, the DAG from dags/ copied beside it.
USER_TEST = """
from __future__ import annotations

import sys
from importlib.metadata import entry_points

import airflow_gpupool
from airflow_gpupool.get_provider_info import get_provider_info


def test_the_installed_wheel_runs_the_example_dag(gpu_cluster):
    assert "site-packages" in airflow_gpupool.__file__, airflow_gpupool.__file__
    assert airflow_gpupool.__version__ == get_provider_info()["versions"][0] == "{version}"
    (provider,) = [e for e in entry_points(group="apache_airflow_provider") if e.value.startswith("airflow_gpupool")]
    assert provider.load()()["package-name"] == "airflow-gpupool"
    cluster = gpu_cluster()
    run = cluster.run_dag("example_gpu_pod")
    assert run.state == "success", [(ti.task_id, ti.state) for ti in run.get_task_instances()]
    (pod,) = cluster.created_pods()
    assert pod["metadata"]["name"].startswith("fine-tune")
    assert cluster.ledger.snapshot().grants == ()  # the slice was given back
"""


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, (
        f"{' '.join(cmd)} exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done


def _clean_env() -> dict[str, str]:
    """Return the environment without this checkout on the path and without this run's Airflow."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON", "VIRTUAL_ENV"))}
    env.pop("KUBECONFIG", None)
    env.pop("GPUPOOL_LEDGER_URL", None)
    return env


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the sdist and the wheel with ``python -m build``, as a release does."""
    for module in ("build", "twine"):
        try:
            __import__(module)
        except ImportError:
            skip_or_fail(f"{module} is not installed (the test extra pins it)", what="the packaging test")
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)])
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("*.whl")
    return wheel


def test_sdist_and_wheel_are_named_by_the_one_version_and_pass_twine_check(dist: Path) -> None:
    assert sorted(p.name for p in dist.iterdir()) == [
        f"airflow_gpupool-{VERSION}-py3-none-any.whl",
        f"airflow_gpupool-{VERSION}.tar.gz",
    ]
    _run([sys.executable, "-m", "twine", "check", "--strict", *map(str, sorted(dist.iterdir()))])


def test_wheel_carries_the_package_data_and_entry_points(dist: Path) -> None:
    with zipfile.ZipFile(_wheel(dist)) as wheel:
        names = set(wheel.namelist())
        entry_points = wheel.read(f"airflow_gpupool-{VERSION}.dist-info/entry_points.txt").decode()
        metadata = wheel.read(f"airflow_gpupool-{VERSION}.dist-info/METADATA").decode()
    missing = [name for name in PACKAGE_DATA if name not in names]
    assert missing == [], f"the wheel lacks {missing}"
    assert not [n for n in names if n.startswith(("tests/", "dags/", "benchmarks/"))]
    assert "provider_info = airflow_gpupool.get_provider_info:get_provider_info" in entry_points
    assert "gpupool = airflow_gpupool.plugins.gpupool:GpuPoolPlugin" in entry_points
    assert "airflow_gpupool.testkit.fixtures = airflow_gpupool.testkit.fixtures" in entry_points
    assert "Requires-Dist: apache-airflow<3.4,>=3.1" in metadata


def test_wheel_installed_in_a_clean_venv_runs_an_example_dag(dist: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, symlinks=True)
    python = str(env_dir / "bin" / "python")
    env = _clean_env()
    # Only the runtime dependencies and the testing extra: -c pins them as CI does, nothing else.
    _run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "-c",
            str(ROOT / "constraints.txt"),
            f"{_wheel(dist)}[testing]",
        ],
        env=env,
    )
    freeze = _run([python, "-m", "pip", "freeze"], env=env).stdout
    assert f"airflow-gpupool @ file://{_wheel(dist)}" in freeze, "installed editable or from elsewhere"
    assert "hypothesis==" not in freeze and "playwright==" not in freeze  # the test extra stayed out

    project = tmp_path / "project"
    (project / "dags").mkdir(parents=True)
    shutil.copy(ROOT / "dags" / "example_gpu_pod.py", project / "dags")
    (project / "test_dag.py").write_text(USER_TEST.replace("{version}", VERSION))
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(project / "dags")
    env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    done = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_dag.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout
