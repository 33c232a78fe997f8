"""The testing kit: the pools advertise what their binding needs; the plugin is registered and light."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from airflow_gpupool.binding import BINDINGS, SliceFacts
from airflow_gpupool.testing import hami_pool, kai_pool, mig_pool, whole_gpu_pool
from airflow_gpupool.testkit.cluster import flatten, ledger_connection

ROOT = Path(__file__).resolve().parents[3]


def _allocatable(pool: object) -> dict[str, str]:
    (node,) = pool.nodes  # type: ignore[attr-defined]
    return dict(node["status"]["allocatable"])


@pytest.mark.parametrize(
    ("pool", "facts"),
    [
        pytest.param(whole_gpu_pool("a", gpus=4), SliceFacts(2, (), 1000, 81920, None), id="whole"),
        pytest.param(mig_pool("m"), SliceFacts(0, (), 0, 0, "1g.10gb"), id="mig"),
        pytest.param(hami_pool("h", gpus=2), SliceFacts(1, (), 250, 4096, None), id="hami"),
        pytest.param(kai_pool("k", gpus=8), SliceFacts(1, (), 1000, 81920, None), id="kai"),
    ],
)
def test_each_pool_advertises_every_resource_its_binding_asks_for(pool: object, facts: SliceFacts) -> None:
    limits = BINDINGS[pool.binding].bind(facts).limits  # type: ignore[attr-defined]
    allocatable = _allocatable(pool)
    assert limits, "the case must ask for a device-plugin resource"
    for resource, amount in limits.items():
        assert resource in allocatable, f"{pool.binding} asks for {resource}, the node lacks it"  # type: ignore[attr-defined]
        assert float(amount) <= float(allocatable[resource])


def test_hami_pool_advertises_memory_and_cores_per_gpu() -> None:
    allocatable = _allocatable(hami_pool("t4", gpus=2, memory_mib=15360))
    assert (allocatable["nvidia.com/gpumem"], allocatable["nvidia.com/gpucores"]) == ("30720", "200")


def test_pools_name_their_nodes_and_bindings() -> None:
    nodes, bindings = flatten([whole_gpu_pool("a100", nodes=2), kai_pool("kai"), mig_pool("mig", gpus=2)])
    assert [n["metadata"]["name"] for n in nodes] == ["a100-0", "a100-1", "kai-0", "mig-0"]
    assert bindings == {"a100": "whole", "kai": "kai", "mig": "mig"}
    assert nodes[2]["metadata"]["labels"]["kai.scheduler/node-pool"] == "kai"
    assert nodes[3]["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "14"
    assert '"node_pool_bindings": "a100=whole,kai=kai,mig=mig"' in ledger_connection("sqlite://", bindings)


def test_duplicate_node_names_are_refused() -> None:
    with pytest.raises(ValueError, match="node names must be unique"):
        flatten([whole_gpu_pool("a"), whole_gpu_pool("a")])
    with pytest.raises(ValueError, match="at least one node"):
        whole_gpu_pool("a", nodes=0)


def test_the_pytest11_entry_point_names_the_fixture_module() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {
        "airflow_gpupool.testkit.fixtures": "airflow_gpupool.testkit.fixtures"
    }
    assert "testing" in project["optional-dependencies"]


def test_loading_the_plugin_imports_nothing_heavy() -> None:
    # pytest loads an entry-point plugin in every run: it must not import the emulator or Airflow.
    code = (
        "import sys, airflow_gpupool.testkit.fixtures as f; "
        "print(sorted(m for m in ('kmock', 'airflow', 'sqlalchemy', 'kubernetes') if m in sys.modules)); "
        "print(sorted(n for n in dir(f) if n.startswith(('gpu', 'gpupool', 'k8s'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    heavy, fixtures = done.stdout.splitlines()
    assert heavy == "[]"
    assert fixtures == str(
        [
            "gpu_cluster",
            "gpupool_airflow_db",
            "gpupool_emulator",
            "gpupool_ledger",
            "k8s_emulator",
            "k8s_emulator_clean",
        ]
    )


def test_the_testing_page_shows_the_example_test_as_ci_runs_it() -> None:
    readme = (ROOT / "docs" / "testing.md").read_text()
    example = (ROOT / "tests" / "integration" / "test_kit_example.py").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert example in blocks
    code = [line for line in example.splitlines() if line.strip() and not line.startswith(("from", "import"))]
    assert len(code) <= 10  # the ten lines a DAG author writes, past the imports


KIT_GUIDE = ROOT / "airflow_gpupool" / "testkit" / "README.md"


@pytest.mark.parametrize(
    "example", ["test_kit_doc_run_result.py", "test_kit_doc_prefill.py", "test_kit_doc_training.py"]
)
def test_the_kit_guide_shows_each_example_test_as_ci_runs_it(example: str) -> None:
    blocks = re.findall(r"```python\n(.*?)```", KIT_GUIDE.read_text(), flags=re.S)
    assert (ROOT / "tests" / "integration" / example).read_text() in blocks


@pytest.mark.parametrize(
    "doc",
    [
        "README.md",
        "docs/testing.md",
        "airflow_gpupool/testing/README.md",
        "airflow_gpupool/testkit/README.md",
    ],
)
def test_no_doc_asks_for_a_conftest_line_to_load_the_kit(doc: str) -> None:
    # One way to load the kit: the pytest11 entry point. A doc naming a plugin module to list in
    # pytest_plugins would be a second one (issue 37: two docs disagreed).
    text = (ROOT / doc).read_text()
    assert not re.search(r"pytest_plugins\s*=\s*\[[^]]*airflow_gpupool", text)
