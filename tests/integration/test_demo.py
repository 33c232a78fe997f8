"""`make demo` end to end: ``python -m airflow_gpupool.demo`` in a process of its own (it sets up Airflow)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_runs_the_example_dags_and_summarizes_them(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GPUPOOL_", "KUBECONFIG"))}
    done = subprocess.run(
        [sys.executable, "-m", "airflow_gpupool.demo", "--dir", str(tmp_path / "demo")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    for task in ("prepare_data", "train", "watch_checkpoints", "evaluate", "decide", "promote"):
        assert re.search(rf"^  {task} +success ", out, re.MULTILINE), (task, out)
    assert re.search(r"^  keep_current +skipped ", out, re.MULTILINE), out
    assert re.search(r"^  train +success +2 .*retry resumed from checkpoint step 3$", out, re.MULTILINE), out
    assert re.search(r"^  train try 1 +gpu-a100-\d .* released$", out, re.MULTILINE), out
    assert re.search(r"^  evaluate try 1 +gpu-t4 +GPU \d: 250 milli-GPU", out, re.MULTILINE), out
    # A plain KubernetesPodOperator (legacy_gpu_pod): gated by the executor hook that the demo's
    # airflow_local_settings installs, admitted by the gatekeeper of the controller running beside
    # the DAGs onto the A100 its nodeSelector names, its grant listed beside the others.
    assert "DAG legacy_gpu_pod: success" in out, out
    assert re.search(
        r"^  embed_catalog +success +1 .* created gated \(gpupool\.io/reservation\), "
        r"admitted by the gatekeeper onto gpu-a100-\d$",
        out,
        re.MULTILINE,
    ), out
    assert re.search(
        r"^  embed_catalog try 1 +gpu-a100-\d +GPU \d \(NVIDIA-A100-SXM4-80GB\) .* released  "
        r"\(gated pod, admitted by the gatekeeper\)$",
        out,
        re.MULTILINE,
    ), out
    assert "grants leaked: 0 " in out and "invariant violations 0" in out
    # One fake node agent per GPU node reported while the DAG ran (issue 17).
    assert (
        "node agents: 4 of 4 nodes reporting, 11 of 11 GPU UUIDs verified; "
        "quarantined: 0 nodes, 0 GPUs; GPU memory leaks: 0" in out
    ), out
    assert "make ui" in out and "postgresql://" in out
    assert "INFO" not in out, "Airflow's logs belong in demo.log"
    assert (tmp_path / "demo" / "demo.log").stat().st_size > 0


def test_make_ui_installs_the_executor_hook_airflow_then_loads(tmp_path: Path) -> None:
    home = tmp_path / "airflow"
    subprocess.run(
        [sys.executable, "-m", "airflow_gpupool.demo", "--write-local-settings", str(home)],
        cwd=REPO,
        check=True,
        timeout=120,
    )
    code = (
        "import sys, airflow.settings as s;"
        "print(len(s.get_policy_plugin_manager().hook.pod_mutation_hook.get_hookimpls()),"
        " sys.modules['airflow_local_settings'].__file__)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")} | {"AIRFLOW_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == f"1 {home / 'config' / 'airflow_local_settings.py'}"
