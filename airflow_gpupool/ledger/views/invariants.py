"""The ledger's safety invariants, recomputed from scratch.

The grants (reservations in state ``granted`` or ``orphaned``) are the truth; capacity
columns are a cache of them. A violation means a GPU was over-granted or the cache drifted.

The cluster's side (:func:`cluster_violations`) checks what the ledger cannot see alone:
the pods that still run on the slices their reservations held, whatever the ledger says
of those reservations now. Two live pods on more of a GPU than it has, or on one MIG
slice, mean a slice was handed out twice.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Connection, Row, select

from airflow_gpupool.labels import RESERVATION_LABEL
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.models import HOLDING_STATES
from airflow_gpupool.resources import MILLI_PER_GPU, GpuRequest, WorkloadClass


def _node_violations(node: Row[Any], used: dict[str, Any]) -> list[str]:
    out = []
    cpu, mem = used["cpu"], used["mem"]
    if cpu > node.cpu_milli or mem > node.memory_mib:
        out.append(
            f"node {node.name}: granted {cpu}m CPU / {mem} MiB of {node.cpu_milli}m / {node.memory_mib} MiB"
        )
    if node.cpu_free != node.cpu_milli - cpu or node.memory_free != node.memory_mib - mem:
        out.append(f"node {node.name}: free CPU/memory columns disagree with its grants")
    if (node.n_training, node.n_inference) != (used["training"], used["inference"]):
        out.append(f"node {node.name}: workload class counts disagree with its grants")
    if used["training"] and used["inference"]:
        out.append(f"node {node.name}: training and inference share the node")
    return out


def _gpu_violations(gpu: Row[Any], milli: int, memory: int) -> list[str]:
    where = f"gpu {gpu.node}/{gpu.idx}"
    out = []
    if gpu.partitioned and milli:
        out.append(f"{where}: MIG-partitioned GPU has {milli} milli granted outside its slices")
    capacity = 0 if gpu.partitioned else MILLI_PER_GPU
    if milli > capacity:
        out.append(f"{where}: over-granted, {milli} milli of {capacity}")
    if memory > gpu.memory_mib:
        out.append(f"{where}: over-granted, {memory} MiB of {gpu.memory_mib} MiB GPU memory")
    if gpu.free_milli != capacity - milli or gpu.free_memory_mib != gpu.memory_mib - memory:
        out.append(f"{where}: free columns disagree with its grants")
    return out


def find_violations(conn: Connection, request_of: Callable[[Row[Any]], GpuRequest]) -> list[str]:
    """Return every invariant violation in the ledger (empty when consistent)."""
    grants = conn.execute(
        select(schema.reservations).where(schema.reservations.c.state.in_(HOLDING_STATES))
    ).all()
    nodes = {r.name: r for r in conn.execute(select(schema.nodes))}
    gpus = {(r.node, r.idx): r for r in conn.execute(select(schema.gpus))}
    migs = {(r.node, r.slice_id): r for r in conn.execute(select(schema.mig_slices))}
    out: list[str] = []
    node_use: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"cpu": 0, "mem": 0, "training": 0, "inference": 0}
    )
    gpu_use: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    slice_holders: dict[tuple[str, str], list[str]] = defaultdict(list)
    for g in grants:
        if g.node not in nodes:
            out.append(f"grant {g.id}: on unknown node {g.node}")
            continue
        request = request_of(g)
        use = node_use[g.node]
        use["cpu"] += request.cpu_milli
        use["mem"] += request.memory_mib
        use["training"] += request.workload_class is WorkloadClass.TRAINING
        use["inference"] += request.workload_class is WorkloadClass.INFERENCE
        if g.mig_slice is not None:
            slice_holders[(g.node, g.mig_slice)].append(g.id)
            continue
        for idx in json.loads(g.gpu_indices or "[]"):
            if (g.node, idx) not in gpus:
                out.append(f"grant {g.id}: on unknown GPU {g.node}/{idx}")
                continue
            gpu_use[(g.node, idx)][0] += g.milli_per_gpu
            gpu_use[(g.node, idx)][1] += g.gpu_memory_mib
    for name, node in nodes.items():
        out += _node_violations(node, node_use[name])
    for key, gpu in gpus.items():
        out += _gpu_violations(gpu, *gpu_use[key])
    return out + _mig_violations(migs, slice_holders) + gang_violations(conn, request_of)


#: Ends the pool itself decides (expiry, timeout): never of one member while others of its gang hold.
_POOL_ENDS = frozenset({"expired", "timed_out"})


def gang_violations(conn: Connection, request_of: Callable[[Row[Any]], GpuRequest]) -> list[str]:
    """Return what breaks a gang's rules: all or nothing, one grant transaction, never cut below its minimum.

    The first ``min_members`` members were granted together (one ``granted_at``), none exists
    while the leader waits, no member waits once the gang ended, and while any member holds
    either ``min_members`` hold or the holder released some (the pool never shrinks a gang).
    """
    r = schema.reservations.c
    rows = conn.execute(
        select(schema.reservations).where(r.gang_id.is_not(None)).order_by(r.gang_id, r.gang_index)
    ).all()
    gangs: dict[str, list[Row[Any]]] = defaultdict(list)
    for row in rows:
        gangs[row.gang_id].append(row)
    out: list[str] = []
    for gang_id, members in gangs.items():
        out += _one_gang(gang_id, members, request_of)
    return out


def _one_gang(
    gang_id: str, members: list[Row[Any]], request_of: Callable[[Row[Any]], GpuRequest]
) -> list[str]:
    leader = members[0]
    spec = request_of(leader).gang if leader.id == gang_id and leader.gang_index == 0 else None
    if spec is None:
        return [f"gang {gang_id}: no leader row with a gang request"]
    where = f"gang {gang_id}"
    if [m.gang_index for m in members] != list(range(len(members))) or len(members) > spec.members:
        return [f"{where}: member indexes {[m.gang_index for m in members]} of at most {spec.members}"]
    if leader.state == "waiting":
        return [f"{where}: member {m.id} exists while its leader waits" for m in members[1:]]
    out = []
    core = members[: spec.min_members]
    if leader.granted_at is not None:
        if len(core) < spec.min_members:
            out.append(f"{where}: granted with {len(core)} of its {spec.min_members} members")
        elif len({m.granted_at for m in core}) != 1:
            out.append(f"{where}: its first {spec.min_members} members were not granted in one transaction")
    holding = [m for m in members if m.state in HOLDING_STATES]
    states = {m.state for m in members}
    if holding and len(holding) < spec.min_members and "released" not in states:
        out.append(f"{where}: {len(holding)} members hold, fewer than its {spec.min_members}, none released")
    if holding and states & _POOL_ENDS:
        out.append(f"{where}: the pool ended members while {len(holding)} others hold")
    if not holding and "waiting" in states:
        out.append(f"{where}: a member waits to grow a gang that holds nothing")
    return out


def _mig_violations(
    migs: dict[tuple[str, str], Row[Any]], slice_holders: dict[tuple[str, str], list[str]]
) -> list[str]:
    out = []
    for key, mig in migs.items():
        holders = slice_holders.get(key, [])
        if len(holders) > 1:
            out.append(f"MIG slice {key[0]}/{key[1]}: granted to {len(holders)} reservations {holders}")
        if mig.holder != (holders[0] if holders else None):
            out.append(
                f"MIG slice {key[0]}/{key[1]}: holder column {mig.holder!r} disagrees with grants {holders}"
            )
    for key in slice_holders:
        if key not in migs:
            out.append(f"MIG slice {key[0]}/{key[1]}: granted but not in the inventory")
    return out


#: Pod phases after which a pod holds no GPU.
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def live_reservation_pods(pods: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """Return ``namespace/name`` of each live (not finished) pod, by its reservation label."""
    out: dict[str, list[str]] = defaultdict(list)
    for pod in pods:
        meta = pod.get("metadata") or {}
        rid = (meta.get("labels") or {}).get(RESERVATION_LABEL)
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if rid and phase not in FINISHED_PHASES and not meta.get("deletionTimestamp"):
            out[rid].append(f"{meta.get('namespace', 'default')}/{meta.get('name')}")
    return out


def cluster_violations(conn: Connection, pods: Iterable[dict[str, Any]]) -> list[str]:
    """Return each GPU or MIG slice that live pods use beyond what it has (empty: none).

    Each live pod labelled with a reservation id uses what that reservation holds or held
    (its node, GPUs and share of each, or MIG slice), whatever state it is in now.

    :param pods: the cluster's pods as JSON dicts
    """
    by_reservation = live_reservation_pods(pods)
    if not by_reservation:
        return []
    r = schema.reservations.c
    rows = conn.execute(select(schema.reservations).where(r.id.in_(list(by_reservation)))).all()
    gpu_pods: dict[tuple[str, int], list[tuple[str, int]]] = defaultdict(list)
    slice_pods: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row in rows:
        if row.node is None:
            continue
        for pod in by_reservation[row.id]:
            if row.mig_slice is not None:
                slice_pods[(row.node, row.mig_slice)].append(pod)
                continue
            for idx in json.loads(row.gpu_indices or "[]"):
                gpu_pods[(row.node, idx)].append((pod, row.milli_per_gpu or 0))
    return _double_use(gpu_pods, slice_pods)


def _double_use(
    gpu_pods: dict[tuple[str, int], list[tuple[str, int]]], slice_pods: dict[tuple[str, str], list[str]]
) -> list[str]:
    out = []
    for (node, idx), users in sorted(gpu_pods.items()):
        if len(users) > 1 and sum(milli for _, milli in users) > MILLI_PER_GPU:
            names = sorted(pod for pod, _ in users)
            out.append(f"gpu {node}/{idx}: used by {len(users)} live pods at once {names}")
    for (node, mig), names in sorted(slice_pods.items()):
        if len(names) > 1:
            out.append(f"MIG slice {node}/{mig}: used by {len(names)} live pods at once {sorted(names)}")
    return out
