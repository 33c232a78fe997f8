"""Small generated traces in the layout of the Alibaba GPU trace 2023 (``gpupool traces synth``).

Unit tests and quick experiments need a trace without the third-party files: this writes a
cluster and the four pod lists under the same names (``<dir>/alibaba-gpu-v2023/...``), so
``GPUPOOL_TRACE_DIR=<dir>`` serves it to everything that reads the named traces. The shapes
follow the published mix loosely: CPU-only pods, GPU-sharing pods with ``gpu_milli`` 1-999 on
one GPU, whole single GPUs, 2/4/8-GPU pods; ``gpushare100`` makes every GPU pod share,
``multigpu50`` half of them multi-GPU, ``gpuspec33`` a third constrained to GPU models.
The numbers are not the Alibaba trace's: use it for tests, not for conclusions.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from airflow_gpupool.sim.fetch import TRACE_SET

__all__ = ["NODE_HEADER", "POD_HEADER", "synthesize"]

NODE_HEADER = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_HEADER = (
    "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos",
    "pod_phase", "creation_time", "deletion_time", "scheduled_time",
)  # fmt: skip
#: Node kinds: (GPUs, model, CPU milli, memory MiB, weight).
_NODE_KINDS = (
    (8, "G2", 96000, 786432, 0.45),
    (2, "P100", 64000, 262144, 0.10),
    (4, "T4", 96000, 393216, 0.15),
    (8, "V100M32", 96000, 786432, 0.10),
    (1, "A10", 32000, 131072, 0.10),
    (0, "", 64000, 262144, 0.10),
)
_QOS = ("LS", "Burstable", "BE", "Guaranteed")
_POD_FILES = {
    "default": "openb_pod_list_default.csv",
    "gpushare100": "openb_pod_list_gpushare100.csv",
    "multigpu50": "openb_pod_list_multigpu50.csv",
    "gpuspec33": "openb_pod_list_gpuspec33.csv",
}
_NODE_FILE = "openb_node_list_gpu_node.csv"


def _nodes(rng: np.random.Generator, count: int) -> list[tuple[object, ...]]:
    weights = np.array([k[-1] for k in _NODE_KINDS])
    kinds = rng.choice(len(_NODE_KINDS), size=count, p=weights / weights.sum())
    rows: list[tuple[object, ...]] = []
    for i, k in enumerate(kinds):
        gpus, model, cpu, memory, _ = _NODE_KINDS[int(k)]
        rows.append((f"synth-node-{i:04d}", cpu, memory, gpus, model))
    return rows


def _gpu_part(rng: np.random.Generator, variant: str) -> tuple[int, int]:
    """Return ``(num_gpu, gpu_milli)`` of one pod for the variant's mix."""
    draw = rng.random()
    if variant == "gpushare100":
        return 1, int(rng.integers(1, 1000))
    if variant == "multigpu50":
        return (int(rng.choice((2, 4, 8))), 1000) if draw < 0.5 else (1, int(rng.integers(1, 1001)))
    if draw < 0.10:
        return 0, 0
    if draw < 0.60:
        return 1, int(rng.choice((100, 200, 250, 300, 460, 500, 750)))
    if draw < 0.90:
        return 1, 1000
    return int(rng.choice((2, 4, 8), p=(0.6, 0.3, 0.1))), 1000


def _pods(rng: np.random.Generator, count: int, variant: str, models: list[str]) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    t = 0
    for i in range(count):
        num, milli = _gpu_part(rng, variant)
        cpu = int(rng.choice((1000, 2000, 4000, 6000, 8000, 12000))) * max(num, 1)
        memory = int(cpu * rng.choice((2, 4, 8)))
        spec = ""
        if variant == "gpuspec33" and num and rng.random() < 1 / 3:
            spec = "|".join(sorted(rng.choice(models, size=min(2, len(models)), replace=False)))
        t += int(rng.integers(1, 600))
        duration = int(rng.integers(60, 24 * 3600))
        qos = _QOS[int(rng.integers(len(_QOS)))]
        rows.append(
            (
                f"synth-pod-{i:05d}",
                cpu,
                memory,
                num,
                milli if num else 0,
                spec,
                qos,
                "Running",
                t,
                t + duration,
                t,
            )
        )
    return rows


def _write(path: Path, header: tuple[str, ...], rows: list[tuple[object, ...]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def synthesize(folder: str | Path, *, nodes: int = 40, pods: int = 400, seed: int = 0) -> list[Path]:
    """Write a generated cluster and the four pod lists under ``folder/alibaba-gpu-v2023/``.

    :param folder: usable as ``GPUPOOL_TRACE_DIR`` afterwards
    :param nodes: number of nodes
    :param pods: pods per pod list
    :param seed: the same seed writes the same files
    :return: the files written
    :raises ValueError: ``nodes`` or ``pods`` is not positive
    """
    if nodes <= 0 or pods <= 0:
        raise ValueError(f"nodes and pods must be positive, got {nodes} and {pods}")
    target = Path(folder).expanduser() / TRACE_SET
    target.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    node_rows = _nodes(rng, nodes)
    if not any(int(str(r[3])) for r in node_rows):
        node_rows[0] = ("synth-node-0000", 96000, 786432, 8, "G2")  # a cluster needs a GPU
    models = sorted({str(r[4]) for r in node_rows if r[4]})
    written = [target / _NODE_FILE]
    _write(written[0], NODE_HEADER, node_rows)
    for variant, filename in _POD_FILES.items():
        path = target / filename
        _write(path, POD_HEADER, _pods(rng, pods, variant, models))
        written.append(path)
    return written
