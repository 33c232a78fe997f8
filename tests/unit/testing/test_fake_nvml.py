"""The fake NVML keeps the real binding's contract: names, argument names, shapes and error types."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pynvml
import pytest

from airflow_gpupool.testing.fake_nvml import (
    FakeNvml,
    add_process,
    fake_gpu_uuid,
    inject_xid,
    node_spec,
    remove_processes,
    write_spec,
)

NVML_FUNCTIONS = sorted(n for n in dir(FakeNvml) if n.startswith("nvml"))


@pytest.mark.parametrize("name", NVML_FUNCTIONS)
def test_every_fake_function_is_a_real_one_with_the_same_arguments(name: str) -> None:
    real = getattr(pynvml, name)
    fake = getattr(FakeNvml, name)
    real_args = list(inspect.signature(real).parameters)
    fake_args = [p for p in inspect.signature(fake).parameters if p != "self"]
    assert fake_args == real_args


def test_the_fake_covers_what_the_agent_calls() -> None:
    # Every nvml* name the collector uses exists on the fake.
    source = Path(__file__).parents[3].joinpath("airflow_gpupool/agent/collect.py").read_text()
    used = set(re.findall(r"nvml\.(nvml[A-Za-z_0-9]+)", source)) - {"nvmlEventTypeXidCriticalError"}
    assert len(used) > 20 and used <= set(NVML_FUNCTIONS)


@pytest.fixture
def nvml() -> FakeNvml:
    spec = node_spec("n1", 2)
    spec["gpus"][0].update(
        processes=[{"pid": 7, "memory_mib": 2048, "pod_uid": "u-1"}],
        ecc={"corrected": 3, "uncorrected": 0},
        mig=[{"uuid": "MIG-aaaa", "memory_mib": 9856}],
    )
    fake = FakeNvml(spec)
    fake.nvmlInit()
    return fake


def test_shapes_match_the_real_structures(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetUUID(h) == fake_gpu_uuid("n1", 0)
    assert nvml.nvmlDeviceGetName(h) == "NVIDIA A100-SXM4-80GB"
    pci = nvml.nvmlDeviceGetPciInfo(h)
    assert pci.busId == b"00000000:07:00.0" and pci.bus == 7
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    assert (mem.total, mem.used, mem.free) == (81920 * 2**20, 2048 * 2**20, (81920 - 2048) * 2**20)
    util = nvml.nvmlDeviceGetUtilizationRates(h)
    assert util.gpu > 0 and set(vars(util)) == {"gpu", "memory"}
    (proc,) = nvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert (proc.pid, proc.usedGpuMemory) == (7, 2048 * 2**20)
    assert (
        nvml.nvmlDeviceGetTotalEccErrors(h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC)
        == 3
    )
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1]
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert nvml.nvmlDeviceGetUUID(mig) == "MIG-aaaa"
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)


def test_errors_are_the_real_binding_classes(nvml: FakeNvml) -> None:
    h1 = nvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no ECC on this one
        nvml.nvmlDeviceGetTotalEccErrors(h1, 0, 0)
    nvml.spec["gpus"][1]["lost"] = True
    with pytest.raises(pynvml.NVMLError_GpuIsLost) as lost:
        nvml.nvmlDeviceGetUUID(h1)
    assert lost.value.value == pynvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(5)
    assert nvml.NVMLError is pynvml.NVMLError and nvml.NVML_TEMPERATURE_GPU == pynvml.NVML_TEMPERATURE_GPU


def test_uninitialised_and_missing_library(tmp_path: Path) -> None:
    fake = FakeNvml(node_spec("n1", 1))
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        FakeNvml(tmp_path / "absent.yaml")


def test_xid_events_are_delivered_once_each(tmp_path: Path) -> None:
    path = tmp_path / "n1.yaml"
    write_spec(path, node_spec("n1", 2))
    fake = FakeNvml(path)
    fake.nvmlInit()
    events = fake.nvmlEventSetCreate()
    for i in range(2):
        fake.nvmlDeviceRegisterEvents(
            fake.nvmlDeviceGetHandleByIndex(i), pynvml.nvmlEventTypeXidCriticalError, events
        )
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait(events, 0)
    inject_xid(path, 1, 79)
    event = fake.nvmlEventSetWait(events, 0)
    assert (fake.nvmlDeviceGetIndex(event.device), event.eventData) == (1, 79)
    assert event.eventType == pynvml.nvmlEventTypeXidCriticalError
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait(events, 0)


def test_the_spec_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "n1.yaml"
    write_spec(path, node_spec("n1", 1))
    fake = FakeNvml(path)
    fake.nvmlInit()
    uuid = fake_gpu_uuid("n1", 0)
    assert add_process(path, uuid, 42, 1000, "pod-a") and not add_process(path, "GPU-nope", 1, 1)
    assert fake.nvmlDeviceGetCount() == 1
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert [p.pid for p in fake.nvmlDeviceGetComputeRunningProcesses(h)] == [42]
    assert fake.pod_uid_of(42) == "pod-a"
    assert remove_processes(path, "pod-a") == 1
    fake.nvmlDeviceGetCount()
    assert fake.nvmlDeviceGetComputeRunningProcesses(h) == []
