"""`make demo`: a SQLite ledger with an example inventory, a few reservations, and `gpupool status`.

Run with ``python -m airflow_gpupool.demo [--dir DIR]``; everything lands under ``DIR``
(default ``.demo/``), which is wiped first so the demo always starts from nothing.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from importlib import resources
from pathlib import Path

from airflow_gpupool.cli import format_status
from airflow_gpupool.inventory import load_inventory, parse_inventory
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.resources import GpuRequest, WorkloadClass

EXAMPLE_INVENTORY = Path(__file__).resolve().parent.parent / "examples" / "inventory.yaml"

# Each request: (holder, request). The last one cannot fit until something is released.
REQUESTS = [
    (
        "nightly-retrain/train",
        GpuRequest(
            gpus=4,
            cpu_milli=32000,
            memory_mib=262144,
            workload_class=WorkloadClass.TRAINING,
            team="recsys",
            priority=10,
        ),
    ),
    (
        "sweep/trial-0",
        GpuRequest(gpu_milli=250, gpu_memory_mib=10240, cpu_milli=4000, memory_mib=16384, team="research"),
    ),
    (
        "sweep/trial-1",
        GpuRequest(gpu_milli=250, gpu_memory_mib=10240, cpu_milli=4000, memory_mib=16384, team="research"),
    ),
    (
        "embeddings/serve",
        GpuRequest(
            mig_profile="1g.10gb",
            cpu_milli=2000,
            memory_mib=8192,
            workload_class=WorkloadClass.INFERENCE,
            team="search",
        ),
    ),
    (
        "big-pretrain/train",
        GpuRequest(
            gpus=8,
            cpu_milli=64000,
            memory_mib=524288,
            workload_class=WorkloadClass.TRAINING,
            team="llm",
            priority=5,
        ),
    ),
    (
        "weekly-eval/train",
        GpuRequest(
            gpus=8, cpu_milli=32000, memory_mib=131072, workload_class=WorkloadClass.TRAINING, team="llm"
        ),
    ),
]


def _inventory() -> list:
    if EXAMPLE_INVENTORY.exists():
        return load_inventory(EXAMPLE_INVENTORY)
    # Installed without the repository: the same example ships inside the package data.
    text = resources.files("airflow_gpupool").joinpath("data/example-inventory.yaml").read_text()
    return parse_inventory(text, "example-inventory.yaml")


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m airflow_gpupool.demo", description=__doc__)
    parser.add_argument("--dir", default=".demo", help="working directory (wiped first)")
    args = parser.parse_args(argv)
    workdir = Path(args.dir).resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    url = f"sqlite:///{workdir / 'ledger.db'}"

    ledger = Ledger.create(url)
    nodes = _inventory()
    change = ledger.upsert_nodes(nodes)
    print(f"Ledger {url}\nLoaded {len(change.added)} nodes from the example inventory.\n")
    for holder, request in REQUESTS:
        reservation = ledger.reserve(request, holder, ttl=3600, timeout=3600)
        if reservation.grant is not None:
            g = reservation.grant
            where = g.mig_slice or ",".join(map(str, g.gpu_indices))
            print(f"  {holder:<22} {request.describe():<55} granted on {g.node} GPU {where}")
        else:
            print(f"  {holder:<22} {request.describe():<55} queued at position {reservation.position}")
            print(f"  {'':<22} {ledger.explain(reservation.id)}")
    print()
    print(format_status(ledger.snapshot()))
    violations = ledger.check_invariants()
    print(f"\ninvariant violations: {len(violations)}")
    print(f"\nTry it yourself:  .venv/bin/gpupool status --url {url}")
    ledger.close()
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
