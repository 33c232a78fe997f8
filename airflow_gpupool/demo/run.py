"""`make demo`: run the ``gpu_retraining`` and ``legacy_gpu_pod`` example DAGs on one machine, then summarize.

Everything is embedded and lands under ``DIR`` (default ``.demo/``, wiped first): an Airflow
metadata database (SQLite, ``DIR/airflow``), a SQLite GPU ledger, and the Kubernetes emulator
(in-process) with a small GPU cluster whose nodes are synced into the ledger. The DAG runs under
``dag.test()``; its training step crashes once after checkpoint 3 and resumes from it. Airflow's
own output goes to ``DIR/demo.log``; the summary goes to stdout.

``legacy_gpu_pod`` is a plain ``KubernetesPodOperator`` with ``nvidia.com/gpu: 1`` and no gpupool
argument: the executor hook, installed as a deployment installs it
(``DIR/airflow/config/airflow_local_settings.py``, which Airflow imports when it starts), gates
its pod, and the controller running beside the DAGs (its gatekeeper) reserves the GPU and admits it.

One fake node agent per GPU node reports to the ledger while the DAG runs (the summary says how
the nodes stand). Run with ``python -m airflow_gpupool.demo [--dir DIR]``; ``--write-nodes FILE``
only writes the demo cluster's nodes, ``--write-fake-nvml DIR`` their fake NVML specs (for ``python -m airflow_gpupool.testing.emulator --nodes FILE``, as ``make
ui`` does). Airflow reads its configuration once, when first imported: this module imports it
only after setting the environment, so it must not be imported by a process that already did:
:func:`main` prepares ``DIR`` and starts a fresh interpreter with the demo's settings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from airflow_gpupool.demo.summary import DAG_ID, LEGACY_DAG_ID, summarize
from airflow_gpupool.labels import HAMI_CORES_RESOURCE, HAMI_MEMORY_RESOURCE
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from airflow_gpupool.testing.fake_nvml import node_spec, write_spec
from airflow_gpupool.testing.pods.gpu_processes import EmulatedGpuProcesses

if TYPE_CHECKING:
    from airflow_gpupool.controller.run import GpuPoolController, PassResult
    from airflow_gpupool.resources import NodeInventory

LOCAL_SETTINGS = "from airflow_gpupool.executor_hook import pod_mutation_hook  # noqa: F401\n"
DAGS_FOLDER = Path(__file__).resolve().parents[2] / "dags"
A100 = "NVIDIA-A100-SXM4-80GB"
NODE_POOL_BINDINGS = "a100-mig=mig,t4-shared=hami"


def demo_nodes() -> list[dict[str, Any]]:
    """Return the demo cluster: two nodes of whole A100s, one MIG-partitioned A100, two T4s shared through HAMi."""
    t4 = gpu_node("gpu-t4", gpus=2, product="Tesla-T4", memory_mib=15360, pool="t4-shared")
    # HAMi's device plugin advertises GPU memory and cores as resources of their own.
    t4["status"]["allocatable"].update({HAMI_MEMORY_RESOURCE: "30720", HAMI_CORES_RESOURCE: "200"})
    return [
        gpu_node("gpu-a100-1", gpus=4, product=A100, memory_mib=81920, pool="a100"),
        gpu_node("gpu-a100-2", gpus=4, product=A100, memory_mib=81920, pool="a100"),
        gpu_node("gpu-mig", gpus=1, product=A100, memory_mib=81920, mig={"1g.10gb": 7}, pool="a100-mig"),
        t4,
    ]


def connection_env(ledger_url: str) -> str:
    """Return the ``AIRFLOW_CONN_GPUPOOL_DEFAULT`` value for the demo ledger.

    :param ledger_url: the ledger's SQLAlchemy URL
    """
    extra = {"ledger_url": ledger_url, "poll_interval_seconds": 0.2, "node_pool_bindings": NODE_POOL_BINDINGS}
    return json.dumps({"conn_type": "gpupool", "extra": extra})


def airflow_environment(workdir: Path) -> dict[str, str]:
    """Return the settings Airflow reads when it is first imported: they must be set before that."""
    return {
        "AIRFLOW_HOME": str(workdir / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    }


def set_environment(workdir: Path, kubeconfig: str, ledger_url: str) -> None:
    """Point Airflow, the example DAGs and the provider at the demo's embedded parts (before Airflow is imported).

    :param workdir: the demo's directory
    :param kubeconfig: the emulator's kubeconfig
    :param ledger_url: the ledger's URL
    """
    os.environ.update(
        {
            **airflow_environment(workdir),
            "KUBECONFIG": kubeconfig,
            "GPUPOOL_EMULATOR": "1",
            "GPUPOOL_CHECKPOINT_ROOT": str(workdir / "checkpoints"),
            "AIRFLOW_CONN_GPUPOOL_DEFAULT": connection_env(ledger_url),
        }
    )
    os.environ.pop("GPUPOOL_LEDGER_URL", None)


@contextlib.contextmanager
def output_to(log_path: Path) -> Iterator[IO[str]]:
    """Send this process's stdout and stderr (file descriptors included) to a log; yield the real stdout.

    :param log_path: the log file
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    console = os.fdopen(os.dup(1), "w", buffering=1)
    with open(log_path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield console
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            console.close()


def migrate_airflow_db(log: IO[str]) -> None:
    """Create the Airflow metadata database (``airflow db migrate`` in a subprocess).

    :param log: where its output goes
    """
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=log, stderr=subprocess.STDOUT
    )


def run_dags(*dag_ids: str) -> list[Any]:
    """Parse the DAGs folder and run each DAG with ``dag.test()``, one after the other; return the DagRuns."""
    from airflow_gpupool.testing.dagbag import dag_bag_class

    DagBag = dag_bag_class()

    bag = DagBag(str(DAGS_FOLDER))
    if bag.import_errors:
        raise RuntimeError(f"example DAGs failed to import: {bag.import_errors}")
    return [bag.get_dag(dag_id).test() for dag_id in dag_ids]


def prepare_workdir(workdir: Path) -> None:
    """Wipe ``workdir`` and install the executor hook in its Airflow home, before Airflow starts.

    :param workdir: the demo's directory
    """
    shutil.rmtree(workdir, ignore_errors=True)
    write_local_settings(workdir / "airflow")


def write_local_settings(airflow_home: Path) -> None:
    """Install the executor hook as a deployment does: ``AIRFLOW_HOME/config/airflow_local_settings.py``.

    :param airflow_home: the Airflow home (its ``config`` folder is on Airflow's ``sys.path``)
    """
    config = airflow_home / "config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "airflow_local_settings.py").write_text(LOCAL_SETTINGS)


def hook_installed(workdir: Path) -> bool:
    """Return whether Airflow imported the demo's ``airflow_local_settings`` when it started."""
    module = sys.modules.get("airflow_local_settings")
    where = workdir / "airflow" / "config" / "airflow_local_settings.py"
    return module is not None and Path(str(module.__file__)).resolve() == where


def controller(ledger: Ledger, kubeconfig: str, gate_interval: float = 0.5) -> GpuPoolController:
    """Return a controller (`gpupool controller run`) of the emulated cluster, in this process.

    :param ledger: the ledger
    :param kubeconfig: the emulator's kubeconfig
    :param gate_interval: seconds between the gatekeeper's passes
    """
    from kubernetes import client

    from airflow_gpupool.controller.leader import LeaderElector, LeaseSettings
    from airflow_gpupool.controller.run import ControllerIntervals, GpuPoolController
    from airflow_gpupool.inventory.sync import core_v1_api

    core = core_v1_api(kubeconfig)
    elector = LeaderElector(client.CoordinationV1Api(core.api_client), LeaseSettings("default", "demo"))
    return GpuPoolController(ledger, core, elector, ControllerIntervals(gate=gate_interval))


def controller_pass(ledger: Ledger, kubeconfig: str) -> PassResult:
    """Run one pass of the controller (`gpupool controller run --once`) in this process.

    :param ledger: the ledger
    :param kubeconfig: the emulator's kubeconfig
    """
    return controller(ledger, kubeconfig).run_once()


@contextlib.contextmanager
def controller_running(ledger: Ledger, kubeconfig: str) -> Iterator[None]:
    """Run the controller (its gatekeeper admits the gated pod) in a thread while the DAGs run.

    :param ledger: the ledger
    :param kubeconfig: the emulator's kubeconfig
    """
    stop = threading.Event()
    thread = threading.Thread(
        target=controller(ledger, kubeconfig).run, args=(stop,), name="gpupool-controller", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


def run_demo(workdir: Path, out: IO[str]) -> bool:
    """Set up the embedded parts under ``workdir``, run the DAGs, print the summary; return whether it passed.

    :param workdir: the demo's directory (prepared by :func:`prepare_workdir` before Airflow started)
    :param out: where to print progress and the summary
    """
    if not hook_installed(workdir):
        raise RuntimeError(
            f"Airflow did not import {workdir / 'airflow' / 'config' / 'airflow_local_settings.py'} "
            "when it started (another airflow_local_settings on sys.path?): the executor hook is not installed"
        )
    log_path = workdir / "demo.log"
    url = f"sqlite:///{workdir / 'ledger.db'}"
    out.write(f"airflow-gpupool demo in {workdir}\n")
    with KubernetesEmulatorServer(nodes=demo_nodes(), default_duration_seconds=0.3) as k8s:
        set_environment(workdir, k8s.kubeconfig_path, url)
        out.write(f"  Kubernetes emulator at {k8s.url}\n")
        ledger = Ledger.create(url)
        try:
            synced = controller_pass(ledger, k8s.kubeconfig_path).synced
            if synced is None:
                raise RuntimeError("the controller could not sync the cluster's nodes (see the log above)")
            out.write(
                f"  ledger {url}: {len(synced.added)} GPU nodes synced from the cluster by a controller pass\n"
            )
            for node in synced.nodes:
                out.write(f"    {node.name:<11} pool {node.node_pool:<10} {_gpu_cell(node)}\n")
            # Issue 17: one fake node agent per GPU node; the kubelet shows running pods' processes.
            assert k8s.api is not None
            k8s.api.kubelet.gpus = EmulatedGpuProcesses(write_fake_nvml(synced.nodes, workdir / "nvml"))
            agents = DemoAgents(ledger, workdir / "nvml", [n.name for n in synced.nodes])
            out.write(f"  {len(agents.names)} node agents on the fake NVML, one heartbeat a second\n")
            with open(log_path, "a") as log:
                out.write("  migrating the Airflow database (SQLite) ...\n")
                migrate_airflow_db(log)
            out.write(
                f"  executor hook installed ({workdir / 'airflow' / 'config' / 'airflow_local_settings.py'}); "
                "the controller runs beside the DAGs, its gatekeeper every 0.5 s\n"
            )
            out.write(
                f"  running {DAG_ID}, then {LEGACY_DAG_ID}, with dag.test() (Airflow output in {log_path}) ...\n"
            )
            started = time.monotonic()
            with output_to(log_path), agents:
                with controller_running(ledger, k8s.kubeconfig_path):
                    dag_runs = run_dags(DAG_ID, LEGACY_DAG_ID)
                seconds = time.monotonic() - started
                after = controller_pass(ledger, k8s.kubeconfig_path)  # its log lines go to demo.log
            out.write(f"  controller pass after the run: {after.summary()}\n")
            return summarize(dag_runs, ledger, k8s, workdir, seconds, out)
        finally:
            ledger.close()


def _gpu_cell(node: Any) -> str:
    whole = [g for g in node.gpus if not g.mig_slices]
    mig = [s.profile for g in node.gpus for s in g.mig_slices]
    parts = []
    if whole:
        parts.append(f"{len(whole)} x {whole[0].model}")
    if mig:
        parts.append(f"MIG {len(mig)} x {mig[0]}")
    if NODE_POOL_BINDINGS.find(f"{node.node_pool}=hami") >= 0:
        parts.append("shared through HAMi")
    return ", ".join(parts)


# -- the node agents (issue 17) -------------------------------------------------------------------


def write_fake_nvml(nodes: Iterable[NodeInventory], directory: Path) -> Path:
    """Write one fake NVML spec per GPU node (``DIR/<node>.yaml``, MIG devices included); return ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    for node in nodes:
        first = node.gpus[0]
        spec = node_spec(node.name, len(node.gpus), model=first.model, memory_mib=first.memory_mib)
        for device, gpu in zip(node.gpus, spec["gpus"], strict=True):
            if device.mig_slices:
                gpu["mig"] = [
                    {"uuid": f"MIG-{gpu['uuid'][4:-2]}{k:02d}", "memory_mib": 9856}
                    for k in range(len(device.mig_slices))
                ]
        write_spec(directory / f"{node.name}.yaml", spec)
    return directory


class DemoAgents:
    """One :class:`~airflow_gpupool.agent.run.NodeAgent` thread per node, on its fake NVML spec."""

    def __init__(self, ledger: Ledger, directory: Path, names: list[str], interval: float = 1.0) -> None:
        from airflow_gpupool.agent.collect import NvmlCollector
        from airflow_gpupool.agent.run import NodeAgent
        from airflow_gpupool.testing.fake_nvml import FakeNvml

        self.names = names
        self.stop = threading.Event()
        self.agents = []
        for name in names:
            fake = FakeNvml(directory / f"{name}.yaml")
            collector = NvmlCollector(fake, name, pod_uid_of=fake.pod_uid_of)
            collector.open()
            self.agents.append(NodeAgent(collector, ledger, interval))
        self.threads = [threading.Thread(target=a.run, args=(self.stop,), daemon=True) for a in self.agents]

    def __enter__(self) -> DemoAgents:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=10)
        for agent in self.agents:
            agent.collector.close()


_PREPARED = "GPUPOOL_DEMO_PREPARED"  # set for the fresh interpreter: the directory is ready


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m airflow_gpupool.demo", description=__doc__)
    parser.add_argument("--dir", default=".demo", help="working directory (wiped first)")
    parser.add_argument(
        "--write-nodes", metavar="FILE", help="only write the demo cluster's nodes (JSON) and exit"
    )
    parser.add_argument(
        "--write-fake-nvml", metavar="DIR", help="only write a fake NVML spec per GPU node into DIR and exit"
    )
    parser.add_argument(
        "--write-local-settings",
        metavar="AIRFLOW_HOME",
        help="only install the executor hook (AIRFLOW_HOME/config/airflow_local_settings.py) and exit",
    )
    args = parser.parse_args(argv)
    if args.write_local_settings:
        write_local_settings(Path(args.write_local_settings))
        return 0
    if args.write_fake_nvml:
        from airflow_gpupool.inventory.nodes import node_from_kubernetes

        inventory = [n for n in (node_from_kubernetes(obj) for obj in demo_nodes()) if n is not None]
        write_fake_nvml(inventory, Path(args.write_fake_nvml))
        return 0
    if args.write_nodes:
        Path(args.write_nodes).parent.mkdir(parents=True, exist_ok=True)
        Path(args.write_nodes).write_text(json.dumps({"nodes": demo_nodes()}, indent=1))
        return 0
    workdir = Path(args.dir).resolve()
    wanted = airflow_environment(workdir)
    if os.environ.get(_PREPARED) != str(workdir) or any(os.environ.get(k) != v for k, v in wanted.items()):
        # Importing this package imported Airflow (its errors derive from Airflow's), which read
        # its configuration and airflow_local_settings then: prepare the directory, then start
        # again in a fresh interpreter with the demo's settings.
        prepare_workdir(workdir)
        wanted[_PREPARED] = str(workdir)
        argv = sys.argv[1:] if argv is None else argv
        os.execve(
            sys.executable, [sys.executable, "-m", "airflow_gpupool.demo", *argv], {**os.environ, **wanted}
        )
    return 0 if run_demo(workdir, sys.stdout) else 1
