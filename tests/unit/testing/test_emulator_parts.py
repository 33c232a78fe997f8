"""Pure parts of the emulator kit: selectors, scheduling, behaviours, nodes, checkpoints, CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from airflow_gpupool.testing import PodBehaviour, gpu_node, load_nodes
from airflow_gpupool.testing.api.selectors import SelectorError, parse_field_selector, parse_label_selector
from airflow_gpupool.testing.cluster.scheduling import NodeAllocations, choose_node, extended_requests
from airflow_gpupool.testing.emulator import build_parser, register
from airflow_gpupool.testing.pods.behaviour import PodRule, behaviour_from_annotations, resolve_behaviour
from airflow_gpupool.testing.pods.checkpoints import local_path, resume_step, write_complete, write_step


def obj(labels: dict[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "labels": labels or {}}, **fields}


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("", {}, True),
        ("app=train", {"app": "train"}, True),
        ("app==train", {"app": "serve"}, False),
        ("app!=train", {}, True),
        ("app in (a, b),tier notin (web)", {"app": "b", "tier": "db"}, True),
        ("app in (a,b)", {"app": "c"}, False),
        ("gpu", {"gpu": ""}, True),
        ("!gpu", {"gpu": "1"}, False),
    ],
)
def test_label_selector(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_label_selector(selector)(obj(labels)) is expected


def test_field_selector_compares_dotted_paths_and_absent_as_empty() -> None:
    event = {"involvedObject": {"name": "p1"}, "type": "Warning"}
    assert parse_field_selector("involvedObject.name=p1,type!=Normal")(event)
    assert not parse_field_selector("involvedObject.name=p2")(event)
    assert parse_field_selector("spec.nodeName=")(obj())
    with pytest.raises(SelectorError):
        parse_field_selector("a in (b)")


def pod(gpus: int = 0, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "base", "image": "x"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": "1"}}
    return {
        "metadata": {"name": "p"},
        "spec": {"containers": [container], **spec},
        "status": {"phase": "Pending"},
    }


def test_scheduler_honours_affinity_taints_cordons_and_capacity() -> None:
    nodes = [
        gpu_node("a", gpus=2),
        gpu_node("b", gpus=8, taints=["nvidia.com/gpu=present:NoSchedule"]),
        gpu_node("c", gpus=8, unschedulable=True),
    ]
    assert choose_node(pod(gpus=1), nodes, NodeAllocations()) == ("a", "")
    node, message = choose_node(pod(gpus=4), nodes, NodeAllocations())
    assert node is None
    assert message == (
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint "
        "{nvidia.com/gpu: present}, 1 node(s) were unschedulable."
    )
    tolerant = pod(gpus=4, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    assert choose_node(tolerant, nodes, NodeAllocations())[0] == "b"
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["b"]}
                        ]
                    }
                ]
            }
        }
    }
    assert choose_node(pod(gpus=1, affinity=affinity), nodes, NodeAllocations())[0] is None
    running = {**pod(gpus=2, nodeName="a"), "status": {"phase": "Running"}}
    assert choose_node(pod(gpus=1), nodes, NodeAllocations.of([running]))[0] is None
    finished = {**running, "status": {"phase": "Succeeded"}}
    assert choose_node(pod(gpus=1), nodes, NodeAllocations.of([finished]))[0] == "a"
    assert extended_requests(pod(gpus=2)) == {"nvidia.com/gpu": 2.0}


def test_annotations_parse_and_rules_win() -> None:
    prefix = "gpupool.emulator/"
    annotations = {
        prefix + "exit-code": "3",
        prefix + "oom-killed": "true",
        prefix + "log-lines": '["a", "b"]',
        prefix + "node-lost": "delete",
        "other/thing": "ignored",
    }
    behaviour = behaviour_from_annotations(annotations)
    assert behaviour == PodBehaviour(exit_code=3, oom_killed=True, log_lines=("a", "b"), node_lost="delete")
    assert behaviour_from_annotations({prefix + "log-lines": "x\ny"}).log_lines == ("x", "y")
    with pytest.raises(ValueError, match="exit-code"):
        behaviour_from_annotations({prefix + "exit-code": "one"})
    pod_dict = {"metadata": {"name": "train-1", "labels": {"team": "cv"}, "annotations": annotations}}
    rules = [
        PodRule(PodBehaviour(exit_code=0), name="train-*"),
        PodRule(PodBehaviour(duration_seconds=9), labels={"team": "nlp"}),
    ]
    resolved = resolve_behaviour(pod_dict, rules)
    assert (resolved.exit_code, resolved.oom_killed, resolved.duration_seconds) == (0, True, None)


def test_gpu_node_labels_and_resources() -> None:
    node = gpu_node(
        "n",
        gpus=7,
        mig={"1g.10gb": 7},
        pool="a100",
        labels={"zone": "z1"},
        taints=[{"key": "k", "effect": "NoSchedule"}],
    )
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/mig.strategy"] == "mixed" and labels["nvidia.com/mig-1g.10gb.count"] == "7"
    assert (
        labels["gpupool.io/pool"] == "a100"
        and labels["zone"] == "z1"
        and labels["kubernetes.io/hostname"] == "n"
    )
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "7"
    assert node["spec"]["taints"] == [{"key": "k", "effect": "NoSchedule"}]


def test_load_nodes_from_yaml_and_json(tmp_path: Path) -> None:
    yaml_file = tmp_path / "nodes.yaml"
    yaml_file.write_text("nodes:\n  - name: g1\n    gpus: 4\n    product: NVIDIA-L4\n")
    raw = gpu_node("g2")
    json_file = tmp_path / "nodes.json"
    json_file.write_text(json.dumps({"kind": "List", "items": [raw]}))
    assert load_nodes(yaml_file)[0]["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert load_nodes(json_file) == [raw]
    json_file.write_text(json.dumps([{"name": "g3", "gpu": 1}]))
    with pytest.raises(ValueError, match="unknown node fields"):
        load_nodes(json_file)


def test_checkpoint_helpers(tmp_path: Path) -> None:
    assert local_path(tmp_path.as_uri()) == tmp_path
    with pytest.raises(ValueError):
        local_path("s3://bucket/x")
    assert [resume_step(v) for v in ("", "3", "step-000012", "file:///c/step-000007/")] == [0, 3, 12, 7]
    step_dir = write_step(tmp_path, 1)
    assert sorted(p.name for p in step_dir.iterdir()) == ["manifest.json", "model.bin"]
    write_complete(tmp_path, 1)
    assert json.loads((tmp_path / "COMPLETE").read_text()) == {"step": 1}


def test_cli_parsers() -> None:
    args = build_parser().parse_args(["--port", "8001", "--kubeconfig", "/tmp/kc"])
    assert (args.port, args.kubeconfig, args.nodes, args.default_duration) == (8001, "/tmp/kc", None, 0.5)
    top = argparse.ArgumentParser()
    register(top.add_subparsers(dest="command"))
    parsed = top.parse_args(["emulator", "--kubeconfig", "kc", "--nodes", "n.yaml"])
    assert parsed.func.__name__ == "run" and parsed.nodes == "n.yaml"
