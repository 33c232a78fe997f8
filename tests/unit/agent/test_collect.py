"""The agent's NVML collector, on the fake backend and on this machine's real pynvml."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from airflow_gpupool.agent.collect import NvmlCollector, pod_uid_from_cgroup
from airflow_gpupool.exceptions import NoGpuError
from airflow_gpupool.testing.fake_nvml import FakeNvml, node_spec


def collector(spec: dict) -> NvmlCollector:
    fake = FakeNvml(spec)
    c = NvmlCollector(fake, "n1", pod_uid_of=fake.pod_uid_of, clock=lambda: 100.0)
    c.open()
    return c


def test_a_sample_has_every_reading() -> None:
    spec = node_spec("n1", 2)
    spec["gpus"][0].update(
        processes=[{"pid": 7, "memory_mib": 2048, "pod_uid": "u-1"}],
        ecc={"corrected": 2, "uncorrected": 0},
        retired_pages={"single_bit": 1, "double_bit": 1},
        temperature=70,
        power_mw=250000,
        utilization={"gpu": 55, "memory": 30},
        mig=[{"uuid": "MIG-1", "memory_mib": 9856, "processes": [{"pid": 9, "memory_mib": 100}]}],
    )
    report = collector(spec).sample(30.0)
    assert report.node == "n1" and report.interval_s == 30.0 and report.collected_at == 100.0
    g0, g1 = report.gpus
    assert g0.uuid == spec["gpus"][0]["uuid"] and g0.bus_id == "00000000:07:00.0"
    assert (g0.memory_total_mib, g0.memory_used_mib) == (81920, 2048)
    assert (g0.utilization_gpu, g0.utilization_memory, g0.temperature_c, g0.power_w) == (55, 30, 70, 250.0)
    assert (g0.ecc_corrected, g0.ecc_uncorrected, g0.retired_pages) == (2, 0, 2)
    assert g0.slowdown_temperature_c == 90
    assert [(p.pid, p.memory_mib, p.pod_uid) for p in g0.processes] == [(7, 2048, "u-1")]
    assert [(m.uuid, m.memory_total_mib, [p.pid for p in m.processes]) for m in g0.mig] == [
        ("MIG-1", 9856, [9])
    ]
    # Readings a GPU does not support are None, not errors.
    assert g1.ecc_corrected is None and g1.retired_pages is None and g1.processes == ()


def test_xids_and_a_lost_gpu() -> None:
    spec = node_spec("n1", 2)
    spec["xid_events"] = [{"id": 1, "gpu": 0, "xid": 48}, {"id": 2, "gpu": 0, "xid": 13}]
    spec["gpus"][1]["lost"] = True
    c = collector(spec)
    g0, g1 = c.sample(30.0).gpus
    assert g0.xids == (48, 13) and not g0.lost
    assert g1.lost and g1.index == 1
    assert c.sample(30.0).gpus[0].xids == ()  # delivered once


def test_no_driver_is_a_clear_error(tmp_path: Path) -> None:
    fake = FakeNvml(node_spec("n1", 0))
    with pytest.raises(NoGpuError, match="no GPU found"):
        NvmlCollector(fake, "n1").open()


def test_real_pynvml_here_has_no_gpu_and_says_so() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # a machine with a GPU: tests/gpu covers it
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA GPU; see tests/gpu")
    with pytest.raises(NoGpuError, match="libnvidia-ml.so") as caught:
        NvmlCollector(pynvml, "here").open()
    assert caught.value.node == "here"


def test_pod_uid_from_cgroup(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/"
        "kubepods-burstable-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice/cri-containerd-abc.scope\n"
    )
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "cgroup").write_text("0::/user.slice/user-1000.slice\n")
    assert pod_uid_from_cgroup(42, tmp_path) == "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
    assert pod_uid_from_cgroup(43, tmp_path) is None
    assert pod_uid_from_cgroup(44, tmp_path) is None
