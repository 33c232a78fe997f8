"""Gatekeeper benchmark: time from a gated pod's creation to its gate's removal, on an idle pool.

A gatekeeper thread runs ``gatekeep`` back to back (``--interval`` seconds apart; ``gpupool
controller run`` uses ``--gate-interval``, 2 s by default, which adds up to that much to each
admission). Pods are created one at a time through the hook, over HTTP to the emulator, against a
SQLite ledger of ``--nodes`` 8-GPU nodes; each pod's latency is measured from its create call to
the watch event that shows its gate removed. Numbers on a shared 2-core machine are noisy.

With ``--queued N``, N gated pods are created first, then gatekeeper passes run back to back
until no more are admitted: admitted pods per second over those passes (an idle pool of
``--nodes`` 8-GPU nodes admits ``8 * nodes`` one-GPU pods; the rest stay queued), the time spent
waiting on the emulator's answers apart from the gatekeeper's own (ledger and bookkeeping), and
the last pass, which admits nothing while the rest wait (the steady state of a full pool).

Usage: ``python benchmarks/gatekeeper.py [--pods 100] [--nodes 20] [--interval 0.05] [--queued 1000]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client import models as k8s

from airflow_gpupool.controller.gatekeeper import gatekeep
from airflow_gpupool.executor_hook import pod_mutation_hook
from airflow_gpupool.inventory import sync_inventory
from airflow_gpupool.inventory.sync import core_v1_api
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node


def gated_pod(name: str) -> dict[str, object]:
    pod = k8s.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=k8s.V1ObjectMeta(name=name, annotations={"gpupool.emulator/duration-seconds": "3600"}),
        spec=k8s.V1PodSpec(
            containers=[
                k8s.V1Container(
                    name="base",
                    image="x",
                    resources=k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}),
                )
            ]
        ),
    )
    pod_mutation_hook(pod)
    return dict(ApiClient().sanitize_for_serialization(pod))


def wait_ungated(server: KubernetesEmulatorServer, name: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = server.pod(name)
        if pod is not None and not pod["spec"].get("schedulingGates"):
            return
        time.sleep(0.002)
    raise TimeoutError(name)


class ApiTimer:
    """Time spent waiting on the API server, summed over the calls of one ``CoreV1Api``."""

    def __init__(self, core: Any) -> None:
        self.seconds = 0.0
        self.calls = 0
        real = core.api_client.call_api

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self.calls += 1

        core.api_client.call_api = timed


def throughput(server: KubernetesEmulatorServer, ledger: Ledger, queued: int) -> str:
    """Create ``queued`` gated pods, then run passes until none is admitted; return the line to print."""
    core = core_v1_api(server.kubeconfig_path)
    for i in range(queued):
        core.create_namespaced_pod("default", gated_pod(f"queued-{i:05d}"))
    timer = ApiTimer(core)
    admitted, passes = 0, 0
    started = time.perf_counter()
    while True:
        pass_started = time.perf_counter()
        result = gatekeep(ledger, core)
        last_pass = time.perf_counter() - pass_started
        passes += 1
        if not result.admitted:
            break
        admitted += len(result.admitted)
    elapsed = time.perf_counter() - started
    own = elapsed - timer.seconds
    return (
        f"queued={queued}: {admitted} admitted in {elapsed:.1f} s over {passes} passes "
        f"({admitted / elapsed:.1f} pods/s), {len(result.waiting)} still waiting; "
        f"{timer.calls} API calls took {timer.seconds:.1f} s, the gatekeeper's own time "
        f"{own:.1f} s ({own / max(admitted, 1) * 1000:.1f} ms per admission); "
        f"a pass with {len(result.waiting)} waiting and none admitted: {last_pass * 1000:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument(
        "--queued", type=int, default=0, help="measure admissions/s with this many pods queued"
    )
    args = parser.parse_args()
    nodes = [gpu_node(f"gpu-{i:03d}", gpus=8) for i in range(args.nodes)]
    with tempfile.TemporaryDirectory() as tmp, KubernetesEmulatorServer(nodes=nodes) as server:
        ledger = Ledger.create(f"sqlite:///{Path(tmp) / 'ledger.db'}")
        core = core_v1_api(server.kubeconfig_path)
        sync_inventory(ledger, core)
        if args.queued:
            print(f"nodes={args.nodes} " + throughput(server, ledger, args.queued))
            ledger.close()
            return
        stop = threading.Event()
        passes: list[float] = []

        def keeper() -> None:
            keeper_core = core_v1_api(server.kubeconfig_path)
            while not stop.wait(args.interval):
                started = time.perf_counter()
                gatekeep(ledger, keeper_core)
                passes.append(time.perf_counter() - started)

        thread = threading.Thread(target=keeper, daemon=True)
        thread.start()
        latencies = []
        try:
            for i in range(args.pods):
                name = f"bench-{i:04d}"
                started = time.perf_counter()
                core.create_namespaced_pod("default", gated_pod(name))
                wait_ungated(server, name)
                latencies.append(time.perf_counter() - started)
        finally:
            stop.set()
            thread.join(10)
            ledger.close()
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    print(
        f"pods={args.pods} nodes={args.nodes} interval={args.interval}s: creation to gate removal "
        f"median {statistics.median(latencies) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; "
        f"gatekeeper pass median {statistics.median(passes) * 1000:.0f} ms over {len(passes)} passes"
    )


if __name__ == "__main__":
    main()
