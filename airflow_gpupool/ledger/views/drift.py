"""Drift: what the ledger holds on each node beside what the cluster runs there.

Everything is counted in GPUs of compute (milli-GPU / 1000): a whole GPU is 1, a share of a GPU
(HAMi, KAI, a fractional grant) its compute share (a memory-only share: its memory over the GPU's
memory, as the external holds count it), a MIG slice its profile's share of the GPU (``1g.10gb``
is 1/7). Each node's *holders* are compared one by one:

* a live grant (granted, orphaned, preempting) against the pod it runs: the pod bound to it by
  name, or any live pod on its node labelled with its reservation (or its gang). A grant with
  such a pod runs its own size (its pod's resources need not express a share: a time-sliced pod
  asks for none); a grant without one runs nothing;
* an external hold (``external:<namespace>/<name>``) against that pod's GPUs, read as the pod
  watch reads them (:func:`~airflow_gpupool.pod_gpus.external_pod`); a pod that names DRA
  ResourceClaims, when the caller reads no claims (``gpupool status``, the exporter), runs what
  the ledger holds for it, as an unreadable pod does;
* any other live, scheduled pod that holds GPUs: the ledger holds nothing for it.

``drift`` is the sum over holders of ``|held − running|``: at least ``|ledger-held −
cluster-running|`` for the node, and not zero when two mistakes cancel (a grant without a pod
beside a pod the ledger missed). A pod whose GPUs cannot be read runs what the ledger holds for
it (the conservative hold is the rule, not drift). A grant just made whose pod is not yet
scheduled is drift for the seconds it takes to launch: the alert waits
(``GpuPoolLedgerDrift``'s ``for``) before it fires.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_gpupool.ledger.db.models import EXTERNAL_HOLDER_PREFIX, LedgerSnapshot, Reservation
from airflow_gpupool.pod_gpus import ClaimLookup, ExternalPod, external_pod, holds_gpus_now
from airflow_gpupool.resources import MIG_PROFILES, MILLI_PER_GPU

__all__ = ["NodeDrift", "ledger_drift"]


@dataclass(frozen=True)
class NodeDrift:
    """One node's books beside its pods, in GPUs.

    :param running: GPUs the cluster's live pods on the node hold (None: no pod list was read)
    :param drift: the sum over holders of ``|held − running|`` (None: no pod list was read)
    :param mismatched: the holders that disagree, as ``holder: held → running``, sorted
    """

    node: str
    capacity: float
    granted: float
    external: float
    running: float | None = None
    drift: float | None = None
    mismatched: tuple[str, ...] = field(default=())

    @property
    def held(self) -> float:
        """What the ledger holds on the node: granted and external."""
        return self.granted + self.external

    @property
    def free(self) -> float:
        """What the ledger holds free (never below 0)."""
        return max(0.0, self.capacity - self.held)

    def to_dict(self) -> dict[str, Any]:
        """Return primitives only (``gpupool status --json``)."""
        return {
            "node": self.node,
            "capacity_gpus": self.capacity,
            "granted_gpus": self.granted,
            "external_gpus": self.external,
            "free_gpus": self.free,
            "running_gpus": self.running,
            "drift_gpus": self.drift,
            "mismatched": list(self.mismatched),
        }


def ledger_drift(
    snapshot: LedgerSnapshot,
    pods: Iterable[Mapping[str, Any]] | None = None,
    claims: ClaimLookup | None = None,
) -> list[NodeDrift]:
    """Return each node's ledger side and, given the cluster's pods, its drift; sorted by node.

    :param snapshot: a ledger snapshot
    :param pods: every pod in the cluster, as the API server sends them (JSON); None: the ledger side only
    :param claims: reads the DRA ResourceClaims the pods name (the controller's); None: not read
    """
    capacity = {n.name: len(n.gpus) * MILLI_PER_GPU for n in snapshot.nodes}
    gpu_memory = {n.name: int(n.gpus[0].get("memory_mib") or 0) for n in snapshot.nodes if n.gpus}
    held: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # node -> holder -> milli
    granted: dict[str, int] = defaultdict(int)
    external: dict[str, int] = defaultdict(int)
    for r in snapshot.grants:
        if r.grant is not None:
            granted[r.grant.node] += r.request.total_gpu_milli
            held[r.grant.node][f"grant {r.id}"] += r.request.total_gpu_milli
    for r in snapshot.external:
        if r.grant is not None:
            external[r.grant.node] += r.request.total_gpu_milli
            held[r.grant.node][r.holder] += r.request.total_gpu_milli
    running = None if pods is None else _running(snapshot.grants, held, pods, gpu_memory, claims)
    nodes = sorted(set(capacity) | set(held) | set(running or ()))
    return [_node_drift(n, capacity, granted, external, held[n], running) for n in nodes]


def _node_drift(
    node: str,
    capacity: Mapping[str, int],
    granted: Mapping[str, int],
    external: Mapping[str, int],
    held: Mapping[str, int],
    running: Mapping[str, Mapping[str, int]] | None,
) -> NodeDrift:
    side = NodeDrift(
        node, _gpus(capacity.get(node, 0)), _gpus(granted.get(node, 0)), _gpus(external.get(node, 0))
    )
    if running is None:
        return side
    runs = running.get(node, {})
    mismatched, drift = [], 0
    for holder in sorted(set(held) | set(runs)):
        h, r = held.get(holder, 0), runs.get(holder, 0)
        if h != r:
            drift += abs(h - r)
            mismatched.append(f"{holder}: {_gpus(h):g} → {_gpus(r):g}")
    return NodeDrift(
        side.node,
        side.capacity,
        side.granted,
        side.external,
        _gpus(sum(runs.values())),
        _gpus(drift),
        tuple(mismatched),
    )


def _running(
    grants: Iterable[Reservation],
    held: Mapping[str, Mapping[str, int]],
    pods: Iterable[Mapping[str, Any]],
    gpu_memory: Mapping[str, int],
    claims: ClaimLookup | None = None,
) -> dict[str, dict[str, int]]:
    """Return node -> holder -> milli-GPU the live pods run."""
    pods = list(pods)
    live = [p for p in (external_pod(pod, claims) for pod in pods) if p is not None]
    on_node: dict[str, list[ExternalPod]] = defaultdict(list)
    for pod in live:
        on_node[pod.node].append(pod)
    runs: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    claimed: set[str] = set()
    for r in grants:
        g = r.grant
        if g is None:
            continue
        for pod in on_node.get(g.node, ()):
            if _runs_under(pod, r):
                runs[g.node][f"grant {r.id}"] = r.request.total_gpu_milli
                claimed.add(pod.key)
    for pod in live:
        if pod.key in claimed:
            continue
        holder = f"{EXTERNAL_HOLDER_PREFIX}{pod.key}"
        if pod.use.unreadable:
            runs[pod.node][holder] += held.get(pod.node, {}).get(holder, 0)
        else:
            runs[pod.node][holder] += _pod_milli(pod, gpu_memory.get(pod.node, 0))
    for node, holder in _unread_claims(pods, claims):
        runs[node][holder] = max(runs[node][holder], held.get(node, {}).get(holder, 0))
    return runs


def _unread_claims(
    pods: Iterable[Mapping[str, Any]], claims: ClaimLookup | None
) -> Iterator[tuple[str, str]]:
    """Yield ``(node, holder)`` of each live pod that names ResourceClaims, when no claim is read."""
    if claims is not None:
        return
    for pod in pods:
        if (pod.get("spec") or {}).get("resourceClaims") and holds_gpus_now(pod):
            meta = pod.get("metadata") or {}
            key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
            yield str(pod["spec"]["nodeName"]), f"{EXTERNAL_HOLDER_PREFIX}{key}"


def _runs_under(pod: ExternalPod, r: Reservation) -> bool:
    g = r.grant
    assert g is not None
    if g.pod_name is not None and (g.pod_namespace or "default", g.pod_name) == (pod.namespace, pod.name):
        return True
    return pod.reservation_id == r.id or (r.gang_id is not None and pod.gang_reservation == r.gang_id)


def _pod_milli(pod: ExternalPod, gpu_memory_mib: int) -> int:
    use = pod.use
    share = use.share_milli
    if share is None and use.shared:
        share = (
            max(1, math.ceil(MILLI_PER_GPU * use.share_memory_mib / gpu_memory_mib))
            if gpu_memory_mib
            else MILLI_PER_GPU
        )
    mig = sum(MIG_PROFILES[p].milli * n if p in MIG_PROFILES else MILLI_PER_GPU * n for p, n in use.mig)
    return use.whole * MILLI_PER_GPU + use.shared * (share or 0) + mig


def _gpus(milli: int) -> float:
    return milli / MILLI_PER_GPU
