"""Early warning: a GPU showing warning signs asks the grants on it for an emergency checkpoint.

The node agent's heartbeat records, per GPU, the warning signs it saw (correctable ECC errors
rising, a non-fatal XID such as 92 or 94, a temperature near the slowdown threshold; see
:mod:`airflow_gpupool.ledger.nodes.agent_report`). Each reconcile interval the controller finds the
grants on such GPUs, reads their pods' ``GPUPOOL_CHECKPOINT_DIR`` and writes the
``CHECKPOINT_NOW`` flag there (:func:`~airflow_gpupool.checkpoints.store.request_checkpoint`): the
training checkpoints at its next safe point, before the GPU fails for good. Once the governance
issue's preemption notice exists, this should send that notice instead of a file.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow_gpupool.checkpoints.manifest import CHECKPOINT_DIR_ENV
from airflow_gpupool.checkpoints.store import CheckpointStore, request_checkpoint

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger

__all__ = ["request_emergency_checkpoints", "warned_grants"]

log = logging.getLogger(__name__)


def warned_grants(ledger: Ledger) -> dict[str, list[str]]:
    """Return, per reservation id, the warning signs its GPUs showed at their last report."""
    out: dict[str, list[str]] = {}
    for node in ledger.snapshot().nodes:
        for gpu in node.gpus:
            warnings = gpu.get("warnings") or []
            for rid in (gpu.get("usage") or {}) if warnings else ():
                out.setdefault(rid, []).extend(f"{node.name} GPU {gpu['uuid']}: {w}" for w in warnings)
    return out


def _checkpoint_dir(core_v1_api: Any, namespace: str, name: str) -> str | None:
    from kubernetes.client.exceptions import ApiException

    try:
        pod = core_v1_api.read_namespaced_pod(name, namespace)
    except ApiException:
        return None
    for container in pod.spec.containers or []:
        for env in container.env or []:
            if env.name == CHECKPOINT_DIR_ENV and env.value:
                return str(env.value)
    return None


def request_emergency_checkpoints(ledger: Ledger, core_v1_api: Any) -> list[str]:
    """Write the ``CHECKPOINT_NOW`` flag for every warned grant whose pod has a checkpoint directory.

    :returns: the reservation ids asked (a flag already there is not asked again)
    """
    asked = []
    for rid, reasons in sorted(warned_grants(ledger).items()):
        grant = ledger.get(rid).grant
        if grant is None or not grant.bound or grant.pod_name is None:
            continue
        location = _checkpoint_dir(core_v1_api, grant.pod_namespace or "default", grant.pod_name)
        if location is None:
            log.info("Grant %s shows warning signs but its pod has no checkpoint directory: %s", rid, reasons)
            continue
        try:
            if request_checkpoint(CheckpointStore(location), rid, reasons, ledger.now()):
                log.warning(
                    "Asked grant %s for an emergency checkpoint in %s: %s", rid, location, "; ".join(reasons)
                )
                asked.append(rid)
        except OSError as e:  # the storage is away: asked again at the next pass
            log.warning("Could not write the checkpoint flag of %s in %s: %s", rid, location, e)
    return asked
