"""The emulator's kubelet drives the fake NVML: a running pod's GPUs show a process using its memory.

When the kubelet has a fake NVML directory (``GPUPOOL_FAKE_NVML_DIR``, or
:attr:`SimulatedKubelet.gpus <airflow_gpupool.testing.pods.kubelet.SimulatedKubelet>` set by hand), one
spec per node (``<dir>/<node>.yaml``, see :mod:`~airflow_gpupool.testing.fake_nvml`), a pod
pinned by the operator (``GPUPOOL_GPU_INDICES`` in its environment) shows, while it runs, one
process per granted GPU using ``GPUPOOL_GPU_MEMORY_MIB`` (or ``gpupool.emulator/gpu-memory-mib``),
attributed to the pod's uid. When it ends the processes go, unless it asks otherwise:

* ``gpupool.emulator/gpu-leak: "true"``: the memory stays after the pod ends (a leaked context);
* ``gpupool.emulator/gpu-xid: "79"``: the XID is raised on its first GPU once it runs.

The agent (``gpupool agent run --backend fake --fake-spec <dir>/<node>.yaml``) reads the file
again when it changes, so a separate agent process sees what the kubelet does.
"""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path
from typing import Any

from airflow_gpupool.testing.fake_nvml import add_process, inject_xid, load_spec, remove_processes

__all__ = [
    "FAKE_NVML_DIR_ENV",
    "LEAK_ANNOTATION",
    "MEMORY_ANNOTATION",
    "XID_ANNOTATION",
    "EmulatedGpuProcesses",
]

log = logging.getLogger(__name__)

FAKE_NVML_DIR_ENV = "GPUPOOL_FAKE_NVML_DIR"
LEAK_ANNOTATION = "gpupool.emulator/gpu-leak"
XID_ANNOTATION = "gpupool.emulator/gpu-xid"
MEMORY_ANNOTATION = "gpupool.emulator/gpu-memory-mib"


def _env(pod: dict[str, Any]) -> dict[str, str]:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return {e.get("name", ""): str(e.get("value", "")) for e in containers[0].get("env") or []}


class EmulatedGpuProcesses:
    """Writes the processes of running pods into the nodes' fake NVML specs.

    :param directory: where the specs are (default: ``GPUPOOL_FAKE_NVML_DIR``); None does nothing
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        directory = directory or os.environ.get(FAKE_NVML_DIR_ENV) or None
        self.directory = Path(directory) if directory else None

    def _spec(self, node: str) -> Path | None:
        if self.directory is None:
            return None
        path = self.directory / f"{node}.yaml"
        return path if path.is_file() else None

    def started(self, pod: dict[str, Any], node: str) -> None:
        """A pod runs on ``node``: show its processes (and raise its XID) on its GPUs."""
        path = self._spec(node)
        env = _env(pod)
        if path is None or not env.get("GPUPOOL_GPU_INDICES"):
            return
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        uid = str(meta.get("uid"))
        memory = int(annotations.get(MEMORY_ANNOTATION) or env.get("GPUPOOL_GPU_MEMORY_MIB") or 1024)
        gpus = load_spec(path)["gpus"]
        indices = [int(i) for i in env["GPUPOOL_GPU_INDICES"].split(",") if i.strip()]
        for n, index in enumerate(indices):
            if 0 <= index < len(gpus):
                pid = 10_000 + zlib.crc32(f"{uid}/{n}".encode()) % 1_000_000
                add_process(path, gpus[index]["uuid"], pid, memory, uid)
        xid = annotations.get(XID_ANNOTATION)
        if xid and indices:
            inject_xid(path, indices[0], int(xid))

    def ended(self, pod: dict[str, Any] | None, uid: str, node: str | None) -> None:
        """A pod ended or was deleted: its processes go, unless it leaks."""
        path = self._spec(node) if node else None
        if path is None:
            return
        annotations = ((pod or {}).get("metadata") or {}).get("annotations") or {}
        if str(annotations.get(LEAK_ANNOTATION, "")).lower() in ("true", "1", "yes"):
            log.info("Pod %s ended but leaks its GPU memory on %s", uid, node)
            return
        remove_processes(path, uid)
