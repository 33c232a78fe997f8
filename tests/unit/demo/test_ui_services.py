"""``make ui``'s services: what the supervisor starts, in order, for a prepared folder."""

from __future__ import annotations

import sys
from pathlib import Path

from airflow_gpupool.demo.ui import services


def test_the_services_are_the_emulator_sync_agents_controller_and_airflow(tmp_path: Path) -> None:
    (tmp_path / "nvml").mkdir()
    for node in ("gpu-b", "gpu-a"):
        (tmp_path / "nvml" / f"{node}.yaml").write_text("gpus: []\n")
    emulator, sync, agents, controller, airflow = services(tmp_path, 9001)
    ledger = f"sqlite:///{tmp_path}/ledger.db"
    assert emulator.argv[1:] == [
        "-m",
        "airflow_gpupool.testing.emulator",
        "--port",
        "9001",
        "--kubeconfig",
        str(tmp_path / "kubeconfig"),
        "--nodes",
        str(tmp_path / "nodes.json"),
    ]
    assert emulator.env is not None and emulator.env["GPUPOOL_FAKE_NVML_DIR"] == str(tmp_path / "nvml")
    assert sync.argv[3:] == [
        "inventory",
        "sync",
        "--url",
        ledger,
        "--kubeconfig",
        str(tmp_path / "kubeconfig"),
    ]
    assert [a.name for a in agents] == ["agent gpu-a", "agent gpu-b"]
    assert agents[0].argv[3:9] == ["agent", "run", "--url", ledger, "--node", "gpu-a"]
    assert agents[0].stderr == tmp_path / "agents.log"
    assert (
        controller.argv[3:6] == ["controller", "run", "--url"]
        and controller.stderr == tmp_path / "controller.log"
    )
    # airflow standalone starts `airflow ...` components from PATH: this venv's must come first.
    assert airflow.argv == [sys.executable, "-m", "airflow", "standalone"]
    assert airflow.env is not None and airflow.env["PATH"].startswith(str(Path(sys.executable).parent))
