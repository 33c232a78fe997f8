"""The static YAML inventory: the documented format, and typed errors that name the bad entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_gpupool.exceptions import InvalidInventoryError
from airflow_gpupool.inventory import load_inventory, parse_inventory
from airflow_gpupool.inventory.yaml_file import memory_to_mib
from airflow_gpupool.resources import GpuDevice, MigSlice, NodeHealth, NodeInventory

DOCUMENTED = """
nodes:
  - name: gpu-a100-0
    cpu: 64
    memory: 512Gi
    node_pool: a100
    labels: {topology.kubernetes.io/zone: zone-a}
    health: healthy
    gpus:
      - model: NVIDIA-A100-SXM4-80GB
        memory: 80Gi
        count: 2
      - model: NVIDIA-A100-SXM4-80GB
        memory: 80Gi
        mig: [3g.40gb, 2g.20gb, 1g.10gb]
  - name: gpu-t4-0
    cpu: 500m
    memory: 512Mi
    health: cordoned
    gpus:
      - model: T4
        memory_mib: 15360
        uuid: GPU-1234-abcd
  - name: cpu-0
    cpu_milli: 2500
    memory_mib: 4096
"""


def test_documented_format_parses_to_exact_nodes() -> None:
    nodes = parse_inventory(DOCUMENTED)

    a100 = "NVIDIA-A100-SXM4-80GB"
    assert nodes == [
        NodeInventory(
            "gpu-a100-0",
            64000,
            524288,
            (
                GpuDevice(0, "GPU-gpu-a100-0-0", a100, 81920),
                GpuDevice(1, "GPU-gpu-a100-0-1", a100, 81920),
                GpuDevice(
                    2,
                    "GPU-gpu-a100-0-2",
                    a100,
                    81920,
                    (
                        MigSlice("gpu2-mig0", "3g.40gb"),
                        MigSlice("gpu2-mig1", "2g.20gb"),
                        MigSlice("gpu2-mig2", "1g.10gb"),
                    ),
                ),
            ),
            (("topology.kubernetes.io/zone", "zone-a"),),
            "a100",
            NodeHealth.HEALTHY,
        ),
        NodeInventory(
            "gpu-t4-0",
            500,
            512,
            (GpuDevice(0, "GPU-1234-abcd", "T4", 15360),),
            (),
            "default",
            NodeHealth.CORDONED,
        ),
        NodeInventory("cpu-0", 2500, 4096),
    ]


@pytest.mark.parametrize(
    ("quantity", "mib"),
    [
        pytest.param("80Gi", 81920, id="Gi"),
        pytest.param("512Mi", 512, id="Mi"),
        pytest.param("1Ti", 1048576, id="Ti"),
        pytest.param("2048Ki", 2, id="Ki"),
        pytest.param("1.5Gi", 1536, id="fractional-Gi"),
        pytest.param("1G", 953, id="decimal-G"),
        pytest.param(" 16Gi ", 16384, id="surrounding-spaces"),
    ],
)
def test_memory_quantities(quantity: object, mib: int) -> None:
    assert memory_to_mib("x", quantity) == mib


# Issue 12: a number without a unit was read as bytes (``memory: 64`` became 0 MiB); a unit is
# now required, plain MiB go in memory_mib. (This table used to accept 1073741824 as bytes.)
@pytest.mark.parametrize("quantity", [64, 1073741824, "1073741824", "64", 64.0, " 80 "])
def test_memory_without_a_unit_is_refused(quantity: object) -> None:
    with pytest.raises(InvalidInventoryError, match="with a unit"):
        memory_to_mib("nodes[0].memory", quantity)


@pytest.mark.parametrize(
    ("cpu", "milli"),
    [
        pytest.param("64", 64000, id="cores"),
        pytest.param("0.5", 500, id="half-core"),
        pytest.param('"500m"', 500, id="milli-cores"),
        pytest.param("1.25", 1250, id="fractional-cores"),
    ],
)
def test_cpu_quantities(cpu: str, milli: int) -> None:
    (node,) = parse_inventory(f"nodes: [{{name: n1, cpu: {cpu}}}]")
    assert node.cpu_milli == milli


@pytest.mark.parametrize(
    ("text", "field"),
    [
        pytest.param("nodes: [name: n1", "<inventory>", id="malformed-yaml"),
        pytest.param("", "<inventory>", id="empty-document"),
        pytest.param("- name: n1", "<inventory>", id="top-level-list"),
        pytest.param("nodes: {name: n1}", "<inventory>", id="nodes-not-a-list"),
        pytest.param("hosts: [{name: n1}]", "<inventory>", id="missing-nodes-key"),
        pytest.param("nodes: []", "<inventory>: nodes", id="empty-node-list"),
        pytest.param("nodes: [n1]", "nodes[0]", id="node-not-a-mapping"),
        pytest.param("nodes: [{name: n1, cpus: 4}]", "nodes[0]", id="unknown-node-key"),
        pytest.param("nodes: [{cpu: 4}]", "nodes[0].name", id="missing-name"),
        pytest.param(
            "nodes: [{name: n1}, {name: n2, memory: 12XB}]", "nodes[1].memory", id="bad-node-memory"
        ),
        pytest.param("nodes: [{name: n1, memory_mib: 1.5}]", "nodes[0].memory_mib", id="float-memory-mib"),
        pytest.param("nodes: [{name: n1, cpu: four}]", "nodes[0].cpu", id="bad-cpu"),
        pytest.param("nodes: [{name: n1, cpu: 4xm}]", "nodes[0].cpu", id="bad-milli-cpu"),
        pytest.param("nodes: [{name: n1, cpu_milli: '4000'}]", "nodes[0].cpu_milli", id="str-cpu-milli"),
        pytest.param("nodes: [{name: n1, gpus: {model: T4}}]", "nodes[0].gpus", id="gpus-not-a-list"),
        pytest.param("nodes: [{name: n1, gpus: [T4]}]", "nodes[0].gpus[0]", id="gpu-not-a-mapping"),
        pytest.param(
            "nodes: [{name: n1, gpus: [{memory: 16Gi}]}]", "nodes[0].gpus[0].model", id="missing-model"
        ),
        pytest.param(
            "nodes: [{name: n1, gpus: [{model: T4, cores: 2}]}]", "nodes[0].gpus[0]", id="unknown-gpu-key"
        ),
        pytest.param(
            "nodes: [{name: n0}, {name: n1, gpus: [{model: T4, memory: lots}]}]",
            "nodes[1].gpus[0].memory",
            id="bad-gpu-memory",
        ),
        pytest.param(
            "nodes: [{name: n1, gpus: [{model: T4, count: 0}]}]", "nodes[0].gpus[0].count", id="count-zero"
        ),
        pytest.param(
            "nodes: [{name: n1, gpus: [{model: T4, count: '2'}]}]", "nodes[0].gpus[0].count", id="count-str"
        ),
        pytest.param(
            "nodes: [{name: n1, gpus: [{model: T4, count: 2, uuid: GPU-x}]}]",
            "nodes[0].gpus[0].count",
            id="count-with-uuid",
        ),
        pytest.param(
            "nodes: [{name: n1, gpus: [{model: A100, mig: 3g.40gb}]}]",
            "nodes[0].gpus[0].mig",
            id="mig-not-a-list",
        ),
    ],
)
def test_malformed_inventory_names_the_path(text: str, field: str) -> None:
    with pytest.raises(InvalidInventoryError) as info:
        parse_inventory(text)
    assert info.value.field == field


# Errors the resource model raises (not the YAML reader): typed, and carrying the bad value.
@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param(
            "nodes: [{name: n1, gpus: [{model: A100, mig: [9g.90gb]}]}]", "9g.90gb", id="unknown-mig-profile"
        ),
        pytest.param(
            "nodes: [{name: n1, gpus: [{model: A100, mig: [7g.80gb, 1g.10gb]}]}]",
            ["7g.80gb", "1g.10gb"],
            id="too-many-mig-compute-slices",
        ),
        pytest.param("nodes: [{name: n1, health: broken}]", "broken", id="unknown-health"),
        pytest.param("nodes: [{name: 'bad name'}]", "bad name", id="bad-node-name"),
        pytest.param("nodes: [{name: n1, labels: {'a b': x}}]", "a b", id="bad-label-key"),
        pytest.param("nodes: [{name: n1, gpus: [{model: T4, memory_mib: 0}]}]", 0, id="gpu-memory-zero"),
    ],
)
def test_invalid_values_inside_a_node_are_inventory_errors(text: str, value: object) -> None:
    with pytest.raises(InvalidInventoryError) as info:
        parse_inventory(text)
    assert info.value.value == value


def test_malformed_yaml_reports_the_parser_message() -> None:
    with pytest.raises(InvalidInventoryError) as info:
        parse_inventory("nodes: [name: n1", source="cluster.yaml")
    assert info.value.field == "cluster.yaml"
    assert info.value.expected == "valid YAML"
    assert isinstance(info.value.value, str) and info.value.value


def test_unknown_keys_are_listed_sorted() -> None:
    with pytest.raises(InvalidInventoryError) as info:
        parse_inventory("nodes: [{name: n1, zone: a, cpus: 4}]")
    assert info.value.value == ["cpus", "zone"]


def test_load_inventory_reads_a_file_and_names_it_in_errors(tmp_path: Path) -> None:
    good = tmp_path / "inventory.yaml"
    good.write_text(DOCUMENTED)
    assert [n.name for n in load_inventory(good)] == ["gpu-a100-0", "gpu-t4-0", "cpu-0"]
    assert load_inventory(str(good)) == parse_inventory(DOCUMENTED)

    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: []")
    with pytest.raises(InvalidInventoryError) as info:
        load_inventory(bad)
    assert info.value.field == f"{bad}: nodes"


def test_missing_file_is_an_inventory_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(InvalidInventoryError) as info:
        load_inventory(missing)
    assert info.value.field == "inventory file"
    assert info.value.value == str(missing)
    assert "No such file or directory" in info.value.expected
