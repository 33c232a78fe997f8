"""Fuzz: any inventory YAML gives valid nodes or an InvalidInventoryError naming the field; never a traceback."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpupool.exceptions import InvalidInventoryError
from airflow_gpupool.inventory.yaml_file import check_mig_layout, parse_inventory
from airflow_gpupool.resources import MIG_PROFILES

ODD = st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats() | st.text(max_size=6)
MEMORY = ODD | st.sampled_from(["80Gi", "16Gi", "512Mi", "64", "1.5Gi", "lots", "-1Gi", "1e3Gi"])
PROFILES = st.lists(st.sampled_from(sorted(MIG_PROFILES)) | st.text(max_size=6), max_size=5)
GPU = st.fixed_dictionaries(
    {"model": st.sampled_from(["A100", "T4", "H200"]) | ODD},
    optional={
        "memory": MEMORY,
        "memory_mib": ODD,
        "count": st.integers(-1, 4) | ODD,
        "uuid": st.sampled_from(["GPU-1", "GPU-2"]) | ODD,
        "mig": PROFILES | ODD,
    },
)
NODE = st.fixed_dictionaries(
    {"name": st.sampled_from(["n1", "n2", "n3"]) | ODD},
    optional={
        "cpu": ODD | st.sampled_from(["64", "500m", "x"]),
        "memory": MEMORY,
        "node_pool": ODD | st.just("a100"),
        "labels": st.dictionaries(st.text(max_size=5), ODD, max_size=2) | ODD,
        "health": st.sampled_from(["healthy", "cordoned", "sick"]) | ODD,
        "gpus": st.lists(GPU, max_size=3) | ODD,
    },
)


@settings(max_examples=300, deadline=None)
@given(nodes=st.lists(NODE, max_size=4))
def test_any_inventory_is_valid_or_a_typed_error(nodes: list[dict[str, Any]]) -> None:
    text = yaml.safe_dump({"nodes": nodes})
    try:
        parsed = parse_inventory(text)
    except InvalidInventoryError as e:
        assert e.field and e.expected  # it names the field and what is allowed
        return
    names = [n.name for n in parsed]
    assert len(names) == len(set(names)) and all(isinstance(n.node_pool, str) for n in parsed)
    uuids = [g.uuid for n in parsed for g in n.gpus]
    assert len(uuids) == len(set(uuids))
    for node in parsed:
        for gpu in node.gpus:
            # An accepted MIG layout is one the GPU can have.
            check_mig_layout("accepted", [s.profile for s in gpu.mig_slices], gpu.memory_mib)
            slices = sum(MIG_PROFILES[s.profile].compute_slices for s in gpu.mig_slices)
            assert slices <= 7


def test_the_issue_examples_are_refused() -> None:
    cases = {
        "MIG larger than a T4": "nodes: [{name: t, gpus: [{model: T4, memory: 16Gi, mig: [4g.40gb, 3g.40gb]}]}]",
        "two MIG families": "nodes: [{name: a, gpus: [{model: A100, memory: 80Gi, mig: [3g.40gb, 3g.20gb]}]}]",
        "null pool": "nodes: [{name: a, node_pool: null}]",
        "memory without unit": "nodes: [{name: a, memory: 64}]",
        "UUID on two nodes": "nodes: [{name: a, gpus: [{model: T4, uuid: GPU-1}]}, {name: b, gpus: [{model: T4, uuid: GPU-1}]}]",
        "node twice": "nodes: [{name: a}, {name: a}]",
    }
    for what, text in cases.items():
        try:
            parse_inventory(text)
        except InvalidInventoryError:
            continue
        raise AssertionError(f"{what} was accepted")
