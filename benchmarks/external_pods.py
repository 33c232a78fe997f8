"""External pods at size: time from a foreign GPU pod's creation to the ledger counting it, and the controller's CPU.

The emulator runs in a process of its own (``python -m airflow_gpupool.testing.emulator``) with
``--nodes`` 8-GPU nodes and ``--pods`` pods (a fifth of them holding one GPU each, the rest
CPU-only), so this process is the controller's side alone. Then, for each mode:

* ``watch``: :class:`~airflow_gpupool.controller.external_pods.ExternalPodCounter` (one list,
  then the watch);
* ``poll``: the same counting done by listing every pod every ``--poll-interval`` seconds and
  writing the complete result (what a controller without a watch would do), the yardstick.

``--probes`` foreign GPU pods are created one at a time (``--rate`` per second), each timed from its
create call to the ledger having written it; meanwhile as many CPU-only pods are created and deleted
(churn the counter must read and ignore). CPU is the counter's own threads' (``/proc/self/task``),
per minute of wall time over the probe phase. Numbers on a shared 2-core machine are noisy: compare
the two modes of one run.

Usage: ``python benchmarks/external_pods.py [--nodes 1000] [--pods 10000] [--probes 200] [--rate 10]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from airflow_gpupool.controller.external_pods import ExternalPodCounter
from airflow_gpupool.inventory.sync import core_v1_api, sync_inventory
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.testing import gpu_node

TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(native_ids: list[int]) -> float:
    """User plus system CPU of this process's threads ``native_ids``."""
    total = 0
    for tid in native_ids:
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "app:1", "resources": resources}],
        },
    }


def start_emulator(workdir: Path, nodes: int) -> tuple[subprocess.Popen[bytes], Path]:
    nodes_file, kubeconfig = workdir / "nodes.json", workdir / "kubeconfig"
    nodes_file.write_text(json.dumps([gpu_node(f"gpu-{i:04d}", gpus=8) for i in range(nodes)]))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "airflow_gpupool.testing.emulator",
            "--kubeconfig",
            str(kubeconfig),
            "--nodes",
            str(nodes_file),
            "--default-duration",
            "36000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not kubeconfig.exists():
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError("the emulator did not start")
        time.sleep(0.2)
    return process, kubeconfig


class Poller:
    """List every pod every ``interval`` seconds and write the complete result: the yardstick."""

    def __init__(self, counter: ExternalPodCounter, interval: float) -> None:
        self.counter, self.interval = counter, interval
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.counter.count_once()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()


def run_mode(
    mode: str, args: argparse.Namespace, core: Any, ledger: Ledger, names: list[str]
) -> dict[str, Any]:
    counter = ExternalPodCounter(ledger, core, relist_seconds=3600)
    started = time.monotonic()
    if mode == "watch":
        counter.start()
        while counter.watch.stats.lists < 1:
            time.sleep(0.05)
        threads = [t.native_id for t in threading.enumerate() if t.name.startswith("gpupool-")]
        poller = None
    else:
        counter.count_once()
        poller = Poller(counter, args.poll_interval)
        poller.start()
        threads = [poller.thread.native_id]
    first_list = time.monotonic() - started
    cpu_before, wall_before = thread_cpu_seconds([t for t in threads if t]), time.monotonic()
    latencies: list[float] = []
    n_nodes = args.nodes
    for i in range(args.probes):
        name = f"{mode}-probe-{i}"
        created = time.monotonic()
        core.create_namespaced_pod("default", pod(name, f"gpu-{(i * 7) % n_nodes:04d}", 1))
        churn = f"{mode}-churn-{i}"
        core.create_namespaced_pod("default", pod(churn, f"gpu-{(i * 11) % n_nodes:04d}", 0))
        if names:
            core.delete_namespaced_pod(names.pop(), "default", grace_period_seconds=0)
        names.append(churn)
        key = f"default/{name}"
        deadline = created + 30
        while key not in counter.written_at and time.monotonic() < deadline:
            time.sleep(0.002)
        latencies.append(counter.written_at.get(key, float("inf")) - created)
        time.sleep(max(0.0, 1 / args.rate - (time.monotonic() - created)))
    wall = time.monotonic() - wall_before
    cpu = thread_cpu_seconds([t for t in threads if t]) - cpu_before
    if poller is not None:
        poller.stop()
    else:
        counter.stop()
    latencies.sort()
    return {
        "mode": mode,
        "first_list_s": round(first_list, 2),
        "latency_p50_ms": round(1000 * statistics.median(latencies), 1),
        "latency_p99_ms": round(1000 * latencies[max(0, int(0.99 * len(latencies)) - 1)], 1),
        "latency_max_ms": round(1000 * latencies[-1], 1),
        "cpu_s_per_min": round(60 * cpu / wall, 2),
        "wall_s": round(wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--rate", type=float, default=10.0, help="probe pods created per second")
    parser.add_argument("--poll-interval", type=float, default=2.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        emulator, kubeconfig = start_emulator(workdir, args.nodes)
        try:
            core = core_v1_api(str(kubeconfig))
            ledger = Ledger.create(f"sqlite:///{workdir}/ledger.db")
            sync_inventory(ledger, core)
            t0 = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                list(
                    pool.map(
                        # Every fifth pod holds a GPU: two per node at the defaults, far from full.
                        lambda i: core.create_namespaced_pod(
                            "default",
                            pod(f"bg-{i}", f"gpu-{(i // 5) % args.nodes:04d}", 1 if i % 5 == 0 else 0),
                        ),
                        range(args.pods),
                    )
                )
            print(
                f"{args.pods} pods on {args.nodes} nodes created in {time.monotonic() - t0:.0f} s",
                file=sys.stderr,
            )
            names: list[str] = []
            results = [run_mode(mode, args, core, ledger, names) for mode in ("watch", "poll")]
        finally:
            emulator.terminate()
            emulator.wait(30)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(
            f"{r['mode']:>5}: first list {r['first_list_s']} s; creation to counted p50 {r['latency_p50_ms']} ms, "
            f"p99 {r['latency_p99_ms']} ms, max {r['latency_max_ms']} ms; CPU {r['cpu_s_per_min']} s per minute"
        )


if __name__ == "__main__":
    main()
