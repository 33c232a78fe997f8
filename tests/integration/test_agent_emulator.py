"""Fake node agents on the Kubernetes emulator, with the controller: the acceptance path of issue 17.

The emulator's kubelet writes a running pod's GPU processes into each node's fake NVML spec; the
agents read them through the real collector and write heartbeats to a real ledger (SQLite and
PostgreSQL); the controller quarantines a silent node and releases it when it is back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from airflow_gpupool.agent.run import NodeAgent
from airflow_gpupool.cli import main
from airflow_gpupool.cli.agent import EXIT_NO_GPU, make_collector
from airflow_gpupool.controller.early_warning import request_emergency_checkpoints
from airflow_gpupool.controller.heartbeats import QUARANTINE_EVENT_REASON
from airflow_gpupool.controller.leader import LeaderElector, LeaseSettings
from airflow_gpupool.controller.run import ControllerIntervals, GpuPoolController
from airflow_gpupool.inventory.sync import core_v1_api, sync_inventory
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from airflow_gpupool.testing.fake_nvml import fake_gpu_uuid, load_spec, node_spec, write_spec
from airflow_gpupool.testing.pods.gpu_processes import LEAK_ANNOTATION, XID_ANNOTATION, EmulatedGpuProcesses
from tests.ledger_fixtures import FakeClock

ROOT = Path(__file__).resolve().parents[2]
NODES = ("gpu-a-0", "gpu-b-0")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[KubernetesEmulatorServer, Path]]:
    specs = tmp_path / "nvml"
    specs.mkdir()
    for name in NODES:
        write_spec(specs / f"{name}.yaml", node_spec(name, 2))
    with KubernetesEmulatorServer(
        nodes=[gpu_node(n, gpus=2) for n in NODES], default_duration_seconds=0.2
    ) as k8s:
        assert k8s.api is not None
        k8s.api.kubelet.gpus = EmulatedGpuProcesses(specs)
        yield k8s, specs


@pytest.fixture
def synced(cluster: Any, make_ledger: Any, clock: FakeClock) -> tuple[Ledger, Any, Path, Any]:
    k8s, specs = cluster
    ledger = make_ledger()
    core = core_v1_api(k8s.kubeconfig_path)
    assert sync_inventory(ledger, core).added == NODES
    return ledger, core, specs, k8s


def agent(ledger: Ledger, specs: Path, name: str) -> NodeAgent:
    collector = make_collector("fake", name, str(specs / f"{name}.yaml"))
    collector.open()
    return NodeAgent(collector, ledger, 30.0)


def pinned_pod(name: str, grant: Any, uid_note: str, **annotations: str) -> dict[str, Any]:
    env = [
        {"name": "GPUPOOL_GPU_INDICES", "value": ",".join(map(str, grant.gpu_indices))},
        {"name": "GPUPOOL_GPU_MEMORY_MIB", "value": "4096"},
    ]
    return {
        "metadata": {"name": name, "annotations": {"note": uid_note, **annotations}},
        "spec": {
            "restartPolicy": "Never",
            "nodeName": grant.node,
            "containers": [{"name": "main", "image": "train:1", "env": env}],
        },
    }


def test_a_running_pod_shows_a_process_and_a_leak_is_found_then_cleared(
    synced: Any, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, core, specs, k8s = synced
    a = agent(ledger, specs, "gpu-a-0")
    assert a.run_pass().result.verified == (0, 1)
    held = ledger.reserve(
        GpuRequest(gpus=1, node_labels={"kubernetes.io/hostname": "gpu-a-0"}), "t", reservation_id="r1"
    )
    k8s.configure_pod(name="leaky", duration_seconds=1.0)
    created = core.create_namespaced_pod(
        "default", pinned_pod("leaky", held.grant, "x", **{LEAK_ANNOTATION: "true"})
    )
    uid = created.metadata.uid
    ledger.bind("r1", namespace="default", name="leaky", uid=uid)
    k8s.wait_for_pod("leaky", phases=["Running"])

    running = a.run_pass()
    gpu = running.report.gpus[held.grant.gpu_indices[0]]
    assert [(p.memory_mib, p.pod_uid) for p in gpu.processes] == [(4096, uid)]
    assert running.result.leaks == ()
    usage = ledger.snapshot().to_dict()["nodes"][0]["gpus"][held.grant.gpu_indices[0]]["usage"]["r1"]
    assert usage["memory_used_mib"] == 4096

    k8s.wait_for_pod("leaky")
    ledger.release("r1")
    assert a.run_pass().result.leaks == ()  # within the grace
    clock.advance(61)
    (leak,) = a.run_pass().result.leaks
    assert leak["memory_mib"] == 4096 and leak["gpu"] == fake_gpu_uuid("gpu-a-0", held.grant.gpu_indices[0])

    # The leaked context goes away (the driver reclaims it): the finding clears.
    spec = load_spec(specs / "gpu-a-0.yaml")
    for g in spec["gpus"]:
        g["processes"] = []
    write_spec(specs / "gpu-a-0.yaml", spec)
    assert a.run_pass().result.leaks == ()


def test_an_xid_annotation_quarantines_that_gpu_only(synced: Any) -> None:
    ledger, core, specs, k8s = synced
    b = agent(ledger, specs, "gpu-b-0")
    b.run_pass()
    held = ledger.reserve(
        GpuRequest(gpus=1, node_labels={"kubernetes.io/hostname": "gpu-b-0"}), "t", reservation_id="x"
    )
    core.create_namespaced_pod("default", pinned_pod("xid", held.grant, "y", **{XID_ANNOTATION: "48"}))
    k8s.wait_for_pod("xid")
    ((uuid, reason),) = b.run_pass().result.quarantined
    assert (
        uuid == fake_gpu_uuid("gpu-b-0", held.grant.gpu_indices[0])
        and reason == "XID 48: double-bit ECC error"
    )
    node = [n for n in ledger.snapshot().to_dict()["nodes"] if n["name"] == "gpu-b-0"][0]
    assert node["health"] == "healthy"
    assert [g["health"] for g in node["gpus"]].count("quarantined") == 1


def test_the_controller_quarantines_a_silent_node_and_releases_it(
    synced: Any, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, core, specs, k8s = synced
    monkeypatch.setenv("AIRFLOW__GPUPOOL__HEARTBEAT_STABLE_SECONDS", "60")
    agents = {name: agent(ledger, specs, name) for name in NODES}
    for a in agents.values():
        a.run_pass()
    ledger.reserve(
        GpuRequest(gpus=2, node_labels={"kubernetes.io/hostname": "gpu-a-0"}), "t", reservation_id="live"
    )
    leases = client.CoordinationV1Api(config.new_client_from_config(config_file=k8s.kubeconfig_path))
    elector = LeaderElector(leases, LeaseSettings("default", "c1", lease_duration=600), clock=clock)
    with GpuPoolController(ledger, core, elector, ControllerIntervals(600, 30), clock=clock) as controller:
        assert controller.run_pass().heartbeats.quarantined == ()

        for _ in range(4):  # gpu-a-0's agent is silent for 4 intervals; gpu-b-0's keeps beating
            clock.advance(30)
            agents["gpu-b-0"].run_pass()
        clock.advance(1)
        result = controller.run_pass()
        assert [n for n, _ in result.heartbeats.quarantined] == ["gpu-a-0"]
        assert "heartbeats: gpu-a-0 quarantined" in result.summary()
        events = core.list_namespaced_event("default").items
        assert any(
            e.reason == QUARANTINE_EVENT_REASON and e.involved_object.name == "gpu-a-0" for e in events
        )
        # A quarantined node gets no new grant; its live grant keeps running.
        assert ledger.reserve(GpuRequest(gpus=2), "t", reservation_id="new").grant.node == "gpu-b-0"
        assert (
            ledger.reserve(GpuRequest(gpus=1), "t", reservation_id="waits").state is ReservationState.WAITING
        )
        assert ledger.renew("live").state is ReservationState.GRANTED

        for _ in range(3):  # back, and steady for 60 s
            agents["gpu-a-0"].run_pass()
            agents["gpu-b-0"].run_pass()
            clock.advance(30)
        assert controller.run_pass().heartbeats.released == ("gpu-a-0",)
    ledger.release("live")
    assert ledger.get("waits").state is ReservationState.GRANTED


def test_agent_once_json_through_the_command(synced: Any, ledger_url: str) -> None:
    _, _, specs, _ = synced
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_gpupool.cli",
            "agent",
            "run",
            "--url",
            ledger_url,
            "--node",
            "gpu-a-0",
            "--once",
            "--json",
            "--backend",
            "fake",
            "--fake-spec",
            str(specs / "gpu-a-0.yaml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [g["uuid"] for g in data["report"]["gpus"]] == [fake_gpu_uuid("gpu-a-0", i) for i in range(2)]
    assert data["heartbeat"]["verified"] == [0, 1] and data["error"] is None


def test_agent_without_a_gpu_exits_3_with_a_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a GPU; see tests/gpu")
    except pynvml.NVMLError:
        pass
    code = main(["agent", "run", "--url", f"sqlite:///{tmp_path}/l.db", "--node", "n1", "--once"])
    assert code == EXIT_NO_GPU
    err = capsys.readouterr().err
    assert "no GPU to watch on node n1" in err and "libnvidia-ml.so" in err and "Traceback" not in err
    code = main(["agent", "run", "--node", "n1", "--once", "--backend", "fake"])
    assert code == 2 and "--fake-spec" in capsys.readouterr().err


def test_node_quarantine_and_release_commands(
    synced: Any, ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = synced[0]
    assert main(["node", "quarantine", "gpu-a-0", "--url", ledger_url, "--reason", "fan noise"]) == 0
    assert capsys.readouterr().out.strip() == "node gpu-a-0: quarantined"
    assert (
        main(["node", "quarantine", "gpu-b-0", "--gpu", "0", "--url", ledger_url, "--reason", "x", "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["changed"] is True
    assert main(["status", "--url", ledger_url, "--json"]) == 0
    nodes = {n["name"]: n for n in json.loads(capsys.readouterr().out)["nodes"]}
    assert (nodes["gpu-a-0"]["health"], nodes["gpu-a-0"]["health_source"]) == ("quarantined", "admin")
    assert nodes["gpu-a-0"]["health_reason"] == "fan noise"
    gpu = nodes["gpu-b-0"]["gpus"][0]
    assert {k: gpu[k] for k in ("health", "uuid_verified", "memory_used_mib", "utilization", "leak")} == {
        "health": "quarantined",
        "uuid_verified": False,
        "memory_used_mib": None,
        "utilization": None,
        "leak": None,
    }
    assert ledger.set_health("gpu-a-0", "healthy", source="controller") is False
    assert main(["node", "release", "gpu-a-0", "--url", ledger_url]) == 0
    assert main(["node", "release", "gpu-b-0", "--gpu", "0", "--url", ledger_url]) == 0
    assert main(["node", "quarantine", "nope", "--url", ledger_url, "--reason", "x"]) == 2


def test_warning_signs_ask_the_task_for_an_emergency_checkpoint(
    synced: Any, clock: FakeClock, tmp_path: Path
) -> None:
    ledger, core, specs, k8s = synced
    a = agent(ledger, specs, "gpu-a-0")
    a.run_pass()
    held = ledger.reserve(
        GpuRequest(gpus=1, node_labels={"kubernetes.io/hostname": "gpu-a-0"}), "t", reservation_id="warm"
    )
    ckpt = tmp_path / "ckpt"
    pod = pinned_pod("warm", held.grant, "z")
    pod["spec"]["containers"][0]["env"].append({"name": "GPUPOOL_CHECKPOINT_DIR", "value": f"file://{ckpt}"})
    k8s.configure_pod(name="warm", duration_seconds=30.0)
    created = core.create_namespaced_pod("default", pod)
    ledger.bind("warm", namespace="default", name="warm", uid=created.metadata.uid)
    k8s.wait_for_pod("warm", phases=["Running"])
    a.run_pass()
    assert request_emergency_checkpoints(ledger, core) == []  # nothing to warn of yet
    assert not (ckpt / "CHECKPOINT_NOW").exists()

    spec = load_spec(specs / "gpu-a-0.yaml")
    spec["gpus"][held.grant.gpu_indices[0]]["temperature"] = 88
    write_spec(specs / "gpu-a-0.yaml", spec)
    a.run_pass()
    assert request_emergency_checkpoints(ledger, core) == ["warm"]
    flag = json.loads((ckpt / "CHECKPOINT_NOW").read_text())
    uuid = fake_gpu_uuid("gpu-a-0", held.grant.gpu_indices[0])
    assert flag["reservation_id"] == "warm"
    assert flag["reasons"] == [f"gpu-a-0 GPU {uuid}: temperature 88 °C near the slowdown threshold 90 °C"]
    assert request_emergency_checkpoints(ledger, core) == []  # the flag is there: not asked twice
    (ckpt / "CHECKPOINT_NOW").unlink()  # the training checkpointed and took the flag away
    assert request_emergency_checkpoints(ledger, core) == ["warm"]  # still hot: asked again
