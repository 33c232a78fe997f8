"""The node agent on a real NVIDIA GPU: real UUIDs and memory, a CUDA process seen and gone, a leak.

Run with ``pytest -m gpu tests/gpu`` on a machine with a GPU and its driver; elsewhere these skip
with the reason NVML gives. The process that allocates GPU memory uses the CUDA driver API through
ctypes (``cuda_alloc.py``), so no framework is needed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

from airflow_gpupool.agent.collect import NvmlCollector
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.resources import GpuDevice, GpuRequest, NodeInventory

pytestmark = pytest.mark.gpu

ALLOC = Path(__file__).with_name("cuda_alloc.py")
MIB = 512


@pytest.fixture(scope="module")
def collector() -> Iterator[NvmlCollector]:
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as e:
        pytest.skip(f"no NVIDIA GPU here: NVML says {e}")
    if count == 0:
        pytest.skip("NVML finds no GPU")
    c = NvmlCollector(pynvml, "gpu-test-node")
    c.open()
    yield c
    c.close()


@pytest.fixture
def ledger(tmp_path: Path, collector: NvmlCollector) -> Iterator[Ledger]:
    report = collector.sample(5.0)
    gpus = tuple(
        GpuDevice(g.index, f"gpu-test-{g.index}", g.model or "GPU", max(1, g.memory_total_mib))
        for g in report.gpus
    )
    with Ledger.create(f"sqlite:///{tmp_path}/ledger.db") as led:
        led.upsert_nodes([NodeInventory("gpu-test-node", 64000, 262144, gpus)])
        yield led


def start_allocation(seconds: float) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, str(ALLOC), str(MIB), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.match(r"ready (\d+)", line)
    if match is None:
        proc.kill()
        pytest.fail(f"the CUDA allocation did not start: {line!r}")
    return proc, int(match.group(1))


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def test_real_uuids_and_memory(collector: NvmlCollector, ledger: Ledger) -> None:
    report = collector.sample(5.0)
    for gpu in report.gpus:
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", gpu.uuid), (
            gpu.uuid
        )
        assert re.fullmatch(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9]", gpu.bus_id), gpu.bus_id
        assert gpu.memory_total_mib > 1000 and 0 <= gpu.memory_used_mib <= gpu.memory_total_mib
        assert gpu.temperature_c is None or 0 < gpu.temperature_c < 120
        for mig in gpu.mig:
            assert mig.uuid.startswith("MIG-")
    result = ledger.record_report(report)
    assert result.verified == tuple(g.index for g in report.gpus)
    grant = ledger.reserve(GpuRequest(gpus=1), "t").grant
    assert grant.gpu_uuids_verified and grant.gpu_uuids[0] == report.gpus[grant.gpu_indices[0]].uuid


def test_a_cuda_process_is_seen_with_its_memory_then_gone(collector: NvmlCollector) -> None:
    proc, pid = start_allocation(30)
    try:

        def seen() -> bool:
            procs = {p.pid: p for p in collector.sample(5.0).gpus[0].processes}
            return pid in procs and procs[pid].memory_mib >= MIB

        assert wait_for(seen), "the allocating process never showed on GPU 0 with its memory"
    finally:
        proc.kill()
        proc.wait()
    assert wait_for(lambda: pid not in {p.pid for p in collector.sample(5.0).gpus[0].processes})


def test_memory_kept_after_the_grant_is_released_is_a_leak(collector: NvmlCollector, ledger: Ledger) -> None:
    ledger.record_report(collector.sample(5.0))
    held = ledger.reserve(GpuRequest(gpus=1), "t", reservation_id="leaky")
    assert held.grant.gpu_indices == (0,)
    proc, pid = start_allocation(60)
    try:
        assert wait_for(lambda: pid in {p.pid for p in collector.sample(5.0).gpus[0].processes})
        assert ledger.record_report(collector.sample(5.0), leak_grace_seconds=2).leaks == ()
        ledger.release("leaky")  # the process keeps its memory: a leak once the grace is over
        assert ledger.record_report(collector.sample(5.0), leak_grace_seconds=2).leaks == ()
        time.sleep(2.5)
        leaks = ledger.record_report(collector.sample(5.0), leak_grace_seconds=2).leaks
        assert [leak["index"] for leak in leaks] == [0] and pid in leaks[0]["pids"]
        assert leaks[0]["memory_mib"] >= MIB
    finally:
        proc.kill()
        proc.wait()
    assert wait_for(lambda: not ledger.record_report(collector.sample(5.0), leak_grace_seconds=2).leaks)
