"""External pods at size: time from a foreign GPU pod's creation to the ledger counting it, and the controller's CPU.

The emulator runs in a process of its own (``python -m airflow_gpupool.testing.emulator``) with
``--nodes`` 8-GPU nodes and ``--pods`` pods (a fifth of them holding one GPU each, the rest
CPU-only), so this process is the controller's side alone. Then, for each mode:

* ``watch``: :class:`~airflow_gpupool.controller.external_pods.ExternalPodCounter` (one list,
  then the watch);
* ``poll``: the same counting done by listing every pod every ``--poll-interval`` seconds and
  writing the complete result (what a controller without a watch would do), the yardstick.

``--probes`` foreign GPU pods are created one at a time (``--rate`` per second), each timed from its
create call to the ledger having written it, and then ended (deleted with grace 0 as the next one is
counted), timed from the delete call to the ledger having released its hold; meanwhile as many CPU-only pods are created and deleted
(churn the counter must read and ignore). CPU is the counter's own threads' (``/proc/self/task``),
per minute of wall time over the probe phase. Numbers on a shared 2-core machine are noisy: compare
the two modes of one run.

``--create-only`` measures the emulator alone instead: the pods are created in batches of
``--batch``, and for each batch the time until all its pods are ``Running`` and the emulator
process's own CPU per pod are printed, to compare emulator versions (run it with ``PYTHONPATH``
naming the tree whose emulator to time). ``--unbound`` leaves ``spec.nodeName`` out, so the
emulator's scheduler places every pod.

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

import airflow_gpupool
from airflow_gpupool.controller.external_pods import ExternalPodCounter
from airflow_gpupool.inventory.sync import core_v1_api, sync_inventory
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.testing import gpu_node

TICKS = os.sysconf("SC_CLK_TCK")
PACKAGE_ROOT = str(Path(airflow_gpupool.__file__).resolve().parents[1])


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


def pod(name: str, node: str | None, gpus: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod on ``node`` (``spec.nodeName`` set by its author), or for the scheduler to place (``None``)."""
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "app:1", "resources": resources}],
    }
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def create_background(core: Any, args: argparse.Namespace, start: int, stop: int) -> None:
    """Create background pods ``start`` to ``stop``: every fifth holds a GPU, two per node at the defaults."""

    def create(i: int) -> int:
        node = None if args.unbound else f"gpu-{(i // 5) % args.nodes:04d}"
        body = pod(f"bg-{i}", node, 1 if i % 5 == 0 else 0, {"batch": str(start)})
        # the answer read but not decoded: the client's models would be timed, not the emulator
        return len(core.create_namespaced_pod("default", body, _preload_content=False).data)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(start, stop)))


def not_running(core: Any, batch: int) -> int:
    """How many pods of a batch are not ``Running`` yet."""
    answer = core.list_namespaced_pod(
        "default",
        label_selector=f"batch={batch}",
        field_selector="status.phase!=Running",
        _preload_content=False,
    )
    return len(json.loads(answer.data)["items"])


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU of a whole process (the emulator's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def creation_rates(core: Any, args: argparse.Namespace, emulator_pid: int) -> list[dict[str, float]]:
    """Create ``--pods`` pods in batches of ``--batch``; return each batch's times.

    A batch is done when its pods are ``Running``: the kubelet's work (binding, events, start)
    goes on after the create call is answered, and the rate the emulator keeps is the lower.
    """
    rates = []
    for start in range(0, args.pods, args.batch):
        stop = min(args.pods, start + args.batch)
        began, cpu_before = time.monotonic(), process_cpu_seconds(emulator_pid)
        create_background(core, args, start, stop)
        created = time.monotonic() - began
        while not_running(core, start):
            time.sleep(0.25)
        running = time.monotonic() - began
        # the emulator's own CPU for the batch (its answers to the polls above included): load-proof
        cpu_ms = 1000 * (process_cpu_seconds(emulator_pid) - cpu_before) / (stop - start)
        rates.append(
            {
                "pods_before": start,
                "pods": stop - start,
                "created_s": round(created, 2),
                "running_s": round(running, 2),
                "running_per_s": round((stop - start) / running, 1),
                "emulator_cpu_ms_per_pod": round(cpu_ms, 2),
            }
        )
        print(
            f"pods {start}-{stop}: created in {created:.1f} s, all Running after {running:.1f} s "
            f"({(stop - start) / running:.0f} pods/s); emulator CPU {cpu_ms:.2f} ms per pod",
            file=sys.stderr,
        )
    return rates


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
        # `python -m` puts its working directory first on the path: run it where no package is, with
        # the tree this process imported first, so the emulator timed is the one PYTHONPATH names
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")])},
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


def percentile_99(ordered: list[float]) -> float:
    return ordered[max(0, int(0.99 * len(ordered)) - 1)]


def time_release(core: Any, counter: ExternalPodCounter, name: str) -> float:
    """Delete a counted probe pod (gone at once, grace 0) and time it until its hold is released."""
    key = f"default/{name}"
    counted = counter.written_at.get(key)
    deleted = time.monotonic()
    core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    if counted is None:  # never counted: nothing to release
        return float("inf")
    while counter.written_at.get(key) == counted and time.monotonic() < deleted + 30:
        time.sleep(0.002)
    return counter.written_at[key] - deleted if counter.written_at[key] != counted else float("inf")


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
    releases: list[float] = []
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
        if i > 0:  # the previous probe ends: its hold must be released
            releases.append(time_release(core, counter, f"{mode}-probe-{i - 1}"))
        time.sleep(max(0.0, 1 / args.rate - (time.monotonic() - created)))
    wall = time.monotonic() - wall_before
    cpu = thread_cpu_seconds([t for t in threads if t]) - cpu_before
    if poller is not None:
        poller.stop()
    else:
        counter.stop()
    latencies.sort()
    releases.sort()
    return {
        "mode": mode,
        "first_list_s": round(first_list, 2),
        "latency_p50_ms": round(1000 * statistics.median(latencies), 1),
        "latency_p99_ms": round(1000 * percentile_99(latencies), 1),
        "latency_max_ms": round(1000 * latencies[-1], 1),
        "release_p50_ms": round(1000 * statistics.median(releases), 1) if releases else None,
        "release_p99_ms": round(1000 * percentile_99(releases), 1) if releases else None,
        "release_max_ms": round(1000 * releases[-1], 1) if releases else None,
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
    parser.add_argument("--modes", nargs="+", choices=("watch", "poll"), default=["watch", "poll"])
    parser.add_argument("--create-only", action="store_true", help="time the emulator's pod creation alone")
    parser.add_argument("--batch", type=int, default=500, help="pods per timed batch (--create-only)")
    parser.add_argument(
        "--unbound", action="store_true", help="background pods placed by the emulator's scheduler, not bound"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        emulator, kubeconfig = start_emulator(workdir, args.nodes)
        try:
            core = core_v1_api(str(kubeconfig))
            if args.create_only:
                rates = creation_rates(core, args, emulator.pid)
                print(json.dumps({"nodes": args.nodes, "batches": rates}))
                return
            ledger = Ledger.create(f"sqlite:///{workdir}/ledger.db")
            sync_inventory(ledger, core)
            t0 = time.monotonic()
            create_background(core, args, 0, args.pods)
            print(
                f"{args.pods} pods on {args.nodes} nodes created in {time.monotonic() - t0:.0f} s",
                file=sys.stderr,
            )
            names: list[str] = []
            results = [run_mode(mode, args, core, ledger, names) for mode in args.modes]
        finally:
            emulator.terminate()
            emulator.wait(30)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(
            f"{r['mode']:>5}: first list {r['first_list_s']} s; creation to counted p50 {r['latency_p50_ms']} ms, "
            f"p99 {r['latency_p99_ms']} ms, max {r['latency_max_ms']} ms; end to released p50 "
            f"{r['release_p50_ms']} ms, p99 {r['release_p99_ms']} ms; CPU {r['cpu_s_per_min']} s per minute"
        )


if __name__ == "__main__":
    main()
