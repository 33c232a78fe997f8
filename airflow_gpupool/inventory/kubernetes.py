"""Inventory from Kubernetes: GPU nodes into the ledger, and grants whose pods are gone out of it.

:func:`node_from_kubernetes` turns one core/v1 Node into a :class:`NodeInventory` (pure, no I/O);
:func:`sync_inventory` upserts every GPU node of a cluster and drains ledger nodes that left it;
:func:`reconcile` releases grants whose pods finished or never appeared.

What a Node says and how it is read:

* whole GPUs: allocatable ``nvidia.com/gpu``; MIG slices (mixed strategy): allocatable
  ``nvidia.com/mig-<profile>``, packed onto GPUs of 7 compute slices each, biggest profile first;
  the single strategy (``nvidia.com/mig.strategy=single``, product ``<model>-MIG-<profile>``) is read
  as that many slices of one profile;
* GPU count: the GFD label ``nvidia.com/gpu.count`` caps whole GPUs at ``count - MIG GPUs``
  (the emulator and some device-plugin versions advertise partitioned GPUs in ``nvidia.com/gpu``
  too), and allocatable can only lower it (the device plugin withdraws unhealthy GPUs);
* model and memory: GFD ``nvidia.com/gpu.product`` and ``nvidia.com/gpu.memory`` (MiB); without
  the memory label, the ``<n>GB`` in the product name, else the MIG family, else 16 GiB;
* GPU UUIDs are not in the Node object: GPUs get stable synthetic ids ``<node>-gpu<index>``
  (whole GPUs first, then MIG-partitioned ones) and slices ``mig-<profile>-<k>``; the NVML agent
  supplies real UUIDs;
* health: a ``NotReady`` node (or one tainted ``not-ready``/``unreachable``) is ``quarantined``; a
  cordoned node, or one with a ``NoSchedule``/``NoExecute`` taint that GPU pods do not tolerate
  (all but ``nvidia.com/gpu`` unless told otherwise) is ``cordoned``;
* node pool: ``gpupool.io/pool``, else the GKE, EKS, AKS or Karpenter pool label, else ``default``;
* labels: all of them but ``nvidia.com/gfd.timestamp``, which GFD rewrites every minute and which
  would make every sync an update.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_gpupool import settings
from airflow_gpupool.exceptions import (
    ConfigurationError,
    GpuPoolError,
    InvalidInventoryError,
    InvalidRequestError,
)
from airflow_gpupool.inventory.yaml_file import memory_to_mib
from airflow_gpupool.resources import MIG_PROFILES, GpuDevice, MigSlice, NodeHealth, NodeInventory

if TYPE_CHECKING:
    import argparse

    from airflow_gpupool.ledger import Ledger
    from airflow_gpupool.ledger.models import Reservation

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
COUNT_LABEL = "nvidia.com/gpu.count"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
#: Must equal :data:`airflow_gpupool.operators.pod_spec.LABEL_RESERVATION` (not imported: it pulls in kubernetes).
RESERVATION_LABEL = "gpupool.io/reservation-id"
#: Node-pool labels, first match wins: ours, then GKE, EKS, AKS and Karpenter.
POOL_LABELS = (
    "gpupool.io/pool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
    "karpenter.sh/nodepool",
)
#: Taint keys that GPU pods tolerate, so they do not cordon a node.
DEFAULT_TOLERATED_TAINTS = frozenset({GPU_RESOURCE})
DEFAULT_GPU_MEMORY_MIB = 16 * 1024
DEFAULT_GRACE_SECONDS = 300.0
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
_VOLATILE_LABELS = frozenset({"nvidia.com/gfd.timestamp"})
_UNREACHABLE_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
_HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
_SLICES_PER_GPU = 7
_CPU = re.compile(r"^(?P<number>[0-9]+(\.[0-9]+)?)(?P<milli>m)?$")
_COUNT = re.compile(r"^[0-9]+$")
_SINGLE_MIG_PRODUCT = re.compile(r"^(?P<model>.+)-MIG-(?P<profile>[0-9]+g\.[0-9]+gb)$")
_GB_IN_PRODUCT = re.compile(r"(?<![0-9])(?P<gb>[0-9]{1,4})GB(?![A-Za-z0-9])", re.IGNORECASE)
_PAGE = 500


# -- one node ---------------------------------------------------------------------------------


def node_from_kubernetes(
    node: Mapping[str, Any] | Any,
    *,
    keep_cpu_nodes: bool = False,
    tolerated_taints: Collection[str] = DEFAULT_TOLERATED_TAINTS,
) -> NodeInventory | None:
    """Convert a core/v1 Node to the ledger's inventory; return None for a node without GPUs.

    :param node: a Node as a dict (the API's JSON) or a ``kubernetes.client.V1Node``
    :param keep_cpu_nodes: return GPU-less nodes too (for CPU-only requests)
    :param tolerated_taints: taint keys that do not cordon the node (GPU pods tolerate them)
    :raises InvalidInventoryError: the object is malformed; the error names the node and field
    """
    obj = _as_dict(node)
    metadata = _mapping("node metadata", obj.get("metadata"))
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInventoryError("node metadata.name", name, "a node name")
    where = f"node {name}"
    labels = _labels(where, metadata.get("labels"))
    spec = _mapping(f"{where} spec", obj.get("spec"))
    status = _mapping(f"{where} status", obj.get("status"))
    allocatable = _mapping(f"{where} status.allocatable", status.get("allocatable"))
    try:
        gpus = _gpus(name, allocatable, labels)
        if not gpus and not keep_cpu_nodes:
            return None
        return NodeInventory(
            name=name,
            cpu_milli=_cpu_milli(f"{where} status.allocatable.cpu", allocatable.get("cpu", 0)),
            memory_mib=memory_to_mib(f"{where} status.allocatable.memory", allocatable.get("memory", 0)),
            gpus=gpus,
            labels=labels,  # type: ignore[arg-type]  # normalized to pairs by NodeInventory
            node_pool=next((labels[k] for k in POOL_LABELS if labels.get(k)), "default"),
            health=_health(where, spec, status, frozenset(tolerated_taints)),
        )
    except InvalidRequestError as e:
        if e.field.startswith(where):
            raise
        raise InvalidInventoryError(f"{where} {e.field}", e.value, e.expected) from e


def _as_dict(node: Any) -> Mapping[str, Any]:
    if isinstance(node, Mapping):
        return node
    # V1Node.to_dict() uses Python attribute names, which equal the JSON names of every field read here.
    to_dict = getattr(node, "to_dict", None)
    if callable(to_dict):
        return _mapping("node", to_dict())
    raise InvalidInventoryError("node", type(node).__name__, "a core/v1 Node (a dict or a V1Node)")


def _mapping(where: str, value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInventoryError(where, value, "a mapping")
    return value


def _labels(where: str, value: Any) -> dict[str, str]:
    labels = _mapping(f"{where} metadata.labels", value)
    for key, label in labels.items():
        if not isinstance(label, str):
            raise InvalidInventoryError(f"{where} metadata.labels[{key!r}]", label, "a string")
    return {k: v for k, v in labels.items() if k not in _VOLATILE_LABELS}


def _count(where: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and _COUNT.match(value.strip()):
        return int(value)
    raise InvalidInventoryError(where, value, "a non-negative integer")


def _cpu_milli(where: str, value: Any) -> int:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    match = _CPU.match(value.strip()) if isinstance(value, str) else None
    if not match:
        raise InvalidInventoryError(where, value, "a CPU quantity such as 64, 0.5 or 63500m")
    number = float(match["number"])
    return int(number) if match["milli"] else int(number * 1000)


def _health(
    where: str, spec: Mapping[str, Any], status: Mapping[str, Any], tolerated: frozenset[str]
) -> NodeHealth:
    taints = spec.get("taints") or []
    if not isinstance(taints, list) or not all(isinstance(t, Mapping) for t in taints):
        raise InvalidInventoryError(f"{where} spec.taints", taints, "a list of taints (key, effect)")
    conditions = status.get("conditions") or []
    if not isinstance(conditions, list) or not all(isinstance(c, Mapping) for c in conditions):
        raise InvalidInventoryError(
            f"{where} status.conditions", conditions, "a list of conditions (type, status)"
        )
    hard = {t.get("key") for t in taints if t.get("effect") in _HARD_EFFECTS}
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    # No Ready condition at all: nothing says the node is down (hand-written objects, fresh nodes).
    if (ready is not None and ready.get("status") != "True") or hard & _UNREACHABLE_TAINTS:
        return NodeHealth.QUARANTINED
    if spec.get("unschedulable") or hard - tolerated:
        return NodeHealth.CORDONED
    return NodeHealth.HEALTHY


def _mig_profiles(name: str, allocatable: Mapping[str, Any]) -> list[str]:
    profiles: list[str] = []
    for key in sorted(allocatable):
        if not key.startswith(MIG_RESOURCE_PREFIX):
            continue
        count = _count(f"node {name} status.allocatable[{key!r}]", allocatable[key])
        profile = key[len(MIG_RESOURCE_PREFIX) :]
        if profile not in MIG_PROFILES:
            # Skipping is the safe side: the ledger never grants a slice it cannot describe.
            if count:
                log.warning("Node %s: ignoring %d slice(s) of unknown MIG profile %s", name, count, profile)
            continue
        profiles += [profile] * count
    return profiles


def _pack(profiles: list[str]) -> list[list[str]]:
    """Pack MIG profiles onto GPUs of 7 compute slices: first fit, biggest first."""
    gpus: list[list[str]] = []
    used: list[int] = []
    for profile in sorted(profiles, key=lambda p: (-MIG_PROFILES[p].compute_slices, p)):
        size = MIG_PROFILES[profile].compute_slices
        k = next((i for i, u in enumerate(used) if u + size <= _SLICES_PER_GPU), None)
        if k is None:
            gpus.append([])
            used.append(0)
            k = len(gpus) - 1
        gpus[k].append(profile)
        used[k] += size
    return gpus


def _gpu_memory(name: str, labels: Mapping[str, str], product: str, packed: list[list[str]]) -> int:
    if MEMORY_LABEL in labels:
        memory = _count(f"node {name} metadata.labels[{MEMORY_LABEL!r}]", labels[MEMORY_LABEL])
        if memory:
            return memory
    match = _GB_IN_PRODUCT.search(product)
    if match and int(match["gb"]):
        return int(match["gb"]) * 1024
    families = [MIG_PROFILES[p].family_gb for group in packed for p in group]
    return max(families) * 1024 if families else DEFAULT_GPU_MEMORY_MIB


def _gpus(name: str, allocatable: Mapping[str, Any], labels: Mapping[str, str]) -> tuple[GpuDevice, ...]:
    whole = _count(f"node {name} status.allocatable[{GPU_RESOURCE!r}]", allocatable.get(GPU_RESOURCE, 0))
    product = labels.get(PRODUCT_LABEL) or "unknown"
    profiles = _mig_profiles(name, allocatable)
    single = _SINGLE_MIG_PRODUCT.match(product) if labels.get(MIG_STRATEGY_LABEL) == "single" else None
    if single and single["profile"] in MIG_PROFILES:
        # Single strategy: nvidia.com/gpu counts MIG devices of one profile, not GPUs.
        profiles, whole, product = [single["profile"]] * whole, 0, single["model"]
    packed = _pack(profiles)
    if COUNT_LABEL in labels and not single:
        total = _count(f"node {name} metadata.labels[{COUNT_LABEL!r}]", labels[COUNT_LABEL])
        whole = max(0, min(whole, total - len(packed)))
    # Under the single strategy GFD's memory label describes one MIG device, not the GPU.
    memory = _gpu_memory(name, {} if single else labels, product, packed)
    devices = [GpuDevice(i, f"{name}-gpu{i}", product, memory) for i in range(whole)]
    ordinal: dict[str, int] = {}
    for k, group in enumerate(packed):
        slices = []
        for profile in group:
            slices.append(MigSlice(f"mig-{profile}-{ordinal.get(profile, 0)}", profile))
            ordinal[profile] = ordinal.get(profile, 0) + 1
        index = whole + k
        devices.append(GpuDevice(index, f"{name}-gpu{index}", product, memory, tuple(slices)))
    return tuple(devices)


# -- the Kubernetes API -----------------------------------------------------------------------


def core_v1_api(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """Build a ``CoreV1Api``: from a kubeconfig, or in-cluster when none is given inside a pod.

    :param kubeconfig: kubeconfig file (default: ``KUBECONFIG`` or ``~/.kube/config``)
    :param context: kubeconfig context (default: its current context)
    :raises ConfigurationError: no usable configuration
    """
    from kubernetes import client, config

    try:
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.CoreV1Api(client.ApiClient(configuration))
        return client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig, context=context))
    except config.ConfigException as e:
        raise ConfigurationError(f"cannot configure a Kubernetes client: {e}") from e


def _list(method: Callable[..., Any], **kwargs: Any) -> Iterator[dict[str, Any]]:
    """List objects page by page as plain JSON (V1Node models are slow to build by the thousand)."""
    token = None
    while True:
        response = method(limit=_PAGE, _continue=token, _preload_content=False, **kwargs)
        data = json.loads(response.data)
        yield from data.get("items") or []
        token = (data.get("metadata") or {}).get("continue")
        if not token:
            return


def list_nodes(api: Any) -> list[dict[str, Any]]:
    """Return every Node of the cluster as a dict.

    :param api: a ``kubernetes.client.CoreV1Api``
    """
    return list(_list(api.list_node))


# -- sync -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyncResult:
    """What one inventory sync did, by node name.

    :param drained: nodes gone from Kubernetes that still hold grants: draining, removed once released
    :param removed: nodes gone from Kubernetes, removed from the ledger
    :param errors: ``(node, message)`` for nodes that could not be read or stored; left as they were
    :param nodes: the GPU nodes read from Kubernetes
    """

    added: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    drained: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    errors: tuple[tuple[str, str], ...] = ()
    nodes: tuple[NodeInventory, ...] = field(default=(), repr=False)

    def summary(self) -> str:
        """Return a one-line account such as ``2 added, 0 updated, 1 unchanged, 0 removed, 0 draining``."""
        parts = []
        for label, names in (
            ("added", self.added),
            ("updated", self.updated),
            ("unchanged", self.unchanged),
            ("removed", self.removed),
            ("draining", self.drained),
        ):
            shown = f" ({', '.join(names)})" if names and label != "unchanged" and len(names) <= 5 else ""
            parts.append(f"{len(names)} {label}{shown}")
        if self.errors:
            parts.append(f"{len(self.errors)} failed")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Return primitives only (``--json``)."""
        return {
            "added": list(self.added),
            "updated": list(self.updated),
            "unchanged": list(self.unchanged),
            "drained": list(self.drained),
            "removed": list(self.removed),
            "errors": [{"node": n, "error": m} for n, m in self.errors],
        }


def sync_inventory(
    ledger: Ledger,
    source: Any,
    *,
    prune: bool = True,
    keep_cpu_nodes: bool = False,
    tolerated_taints: Collection[str] = DEFAULT_TOLERATED_TAINTS,
) -> SyncResult:
    """Make the ledger's inventory match the cluster's GPU nodes; idempotent.

    All GPU nodes are upserted in one transaction. A node that cannot be read, or whose new
    inventory would take away a slice that a live grant holds, is reported in ``errors`` and left
    as it was (then the others are stored one by one). Ledger nodes that Kubernetes no longer has,
    or that no longer have GPUs, are removed, or drained while they hold grants.

    :param ledger: the ledger
    :param source: a ``CoreV1Api`` (see :func:`core_v1_api`) or an iterable of Node objects
    :param prune: remove (or drain) ledger nodes that the cluster does not list as GPU nodes; turn
        off when other sources (a static file, another cluster) share the ledger
    :param keep_cpu_nodes: store GPU-less nodes too
    :param tolerated_taints: taint keys that do not cordon a node
    """
    objects: Iterable[Any] = list_nodes(source) if hasattr(source, "list_node") else source
    inventory: list[NodeInventory] = []
    seen: set[str] = set()
    errors: list[tuple[str, str]] = []
    for obj in objects:
        name = _name_of(obj)
        seen.add(name)
        try:
            node = node_from_kubernetes(obj, keep_cpu_nodes=keep_cpu_nodes, tolerated_taints=tolerated_taints)
        except InvalidInventoryError as e:
            log.warning("Skipping node %s: %s", name, e)
            errors.append((name, str(e)))
            continue
        if node is not None:
            inventory.append(node)
    gpu_names = {n.name for n in inventory}
    keep = gpu_names | {name for name, _ in errors}
    added, updated, unchanged = _upsert(ledger, inventory, errors)
    drained: list[str] = []
    removed: list[str] = []
    if prune:
        for record in ledger.snapshot().nodes:
            if record.name in keep:
                continue
            outcome = ledger.remove_node(record.name)
            if outcome == "draining":
                drained.append(record.name)
            elif outcome == "removed":
                removed.append(record.name)
    return SyncResult(
        tuple(added),
        tuple(updated),
        tuple(unchanged),
        tuple(drained),
        tuple(removed),
        tuple(errors),
        tuple(inventory),
    )


def _name_of(obj: Any) -> str:
    try:
        name = _as_dict(obj).get("metadata", {}).get("name")
    except (InvalidInventoryError, AttributeError):
        name = None
    return name if isinstance(name, str) and name else "<unnamed>"


def _upsert(
    ledger: Ledger, inventory: list[NodeInventory], errors: list[tuple[str, str]]
) -> tuple[list[str], list[str], list[str]]:
    try:
        change = ledger.upsert_nodes(inventory)
        return list(change.added), list(change.updated), list(change.unchanged)
    except InvalidInventoryError:
        log.warning("The inventory of one node conflicts with live grants: storing nodes one by one")
    added: list[str] = []
    updated: list[str] = []
    unchanged: list[str] = []
    for node in inventory:
        try:
            change = ledger.upsert_nodes([node])
        except InvalidInventoryError as e:
            errors.append((node.name, str(e)))
            continue
        added += change.added
        updated += change.updated
        unchanged += change.unchanged
    return added, updated, unchanged


# -- reconcile --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReconcileResult:
    """What one reconcile did.

    :param released: ``(reservation id, reason)`` of each grant released
    :param kept: grants whose pods are alive, or still within the grace period
    :param ignored: grants on nodes this cluster does not have (another cluster may share the ledger)
    """

    released: tuple[tuple[str, str], ...] = ()
    kept: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()

    def summary(self) -> str:
        """Return a one-line account such as ``1 released, 2 kept, 0 ignored``."""
        return f"{len(self.released)} released, {len(self.kept)} kept, {len(self.ignored)} ignored"

    def to_dict(self) -> dict[str, Any]:
        """Return primitives only (``--json``)."""
        return {
            "released": [{"id": rid, "reason": reason} for rid, reason in self.released],
            "kept": list(self.kept),
            "ignored": list(self.ignored),
        }


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _verdict(
    reservation: Reservation, pods: list[dict[str, Any]], now: float, grace_seconds: float
) -> str | None:
    """Return why a grant should be released, or None to keep it."""
    if pods:
        if any(_phase(p) not in FINISHED_PHASES for p in pods):
            return None
        # Retries may leave older pods of the same reservation: name the newest.
        last = max(pods, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))
        meta = last["metadata"]
        return f"pod {meta.get('namespace', 'default')}/{meta.get('name')} finished ({_phase(last)})"
    assert reservation.grant is not None
    if now - reservation.grant.granted_at >= grace_seconds:
        return f"no pod for {grace_seconds:g}s"
    return None


def _pods_by_reservation(api: Any, selector: str) -> dict[str, list[dict[str, Any]]]:
    pods: dict[str, list[dict[str, Any]]] = {}
    for pod in _list(api.list_pod_for_all_namespaces, label_selector=selector):
        rid = ((pod.get("metadata") or {}).get("labels") or {}).get(RESERVATION_LABEL)
        if rid:
            pods.setdefault(rid, []).append(pod)
    return pods


def reconcile(
    ledger: Ledger,
    core_v1_api: Any,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    now: float | None = None,
    all_nodes: bool = False,
    id_prefix: str | None = None,
) -> ReconcileResult:
    """Release grants whose pods finished, or that have had no pod for ``grace_seconds``.

    Pods are found by their ``gpupool.io/reservation-id`` label, in all namespaces. A grant with a
    pod that is not finished is kept, whatever its other pods did (a retry's new pod beside the
    failed one).

    :param ledger: the ledger
    :param core_v1_api: a ``kubernetes.client.CoreV1Api``
    :param grace_seconds: how long a grant may wait for its pod (the operator creates it after the grant)
    :param now: the time grants are aged against (default: the ledger's clock)
    :param all_nodes: also judge grants on nodes this cluster does not list; by default they are
        ignored, since a ledger shared by several clusters holds grants whose pods are elsewhere
    :param id_prefix: judge only reservations whose id starts with this (``gp-``: GpuPodOperator's)
    """
    snapshot = ledger.snapshot()
    now = snapshot.taken_at if now is None else now
    cluster_nodes = None if all_nodes else {n["metadata"]["name"] for n in _list(core_v1_api.list_node)}
    pods = _pods_by_reservation(core_v1_api, RESERVATION_LABEL)
    released: list[tuple[str, str]] = []
    kept: list[str] = []
    ignored: list[str] = []
    for reservation in snapshot.grants:
        grant = reservation.grant
        if grant is None or (id_prefix and not reservation.id.startswith(id_prefix)):
            continue
        if cluster_nodes is not None and grant.node not in cluster_nodes:
            ignored.append(reservation.id)
            continue
        reason = _verdict(reservation, pods.get(reservation.id, []), now, grace_seconds)
        if reason is None:
            kept.append(reservation.id)
            continue
        if ledger.release(reservation.id, reason=f"reconcile: {reason}").released:
            log.info("Released %s: %s", reservation.id, reason)
            released.append((reservation.id, reason))
    return ReconcileResult(tuple(released), tuple(kept), tuple(ignored))


def reconcile_grant(
    ledger: Ledger,
    core_v1_api: Any,
    reservation_id: str,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    now: float | None = None,
) -> str | None:
    """Reconcile one grant (from a lease renewal): release it if its pod finished or never came.

    :param ledger: the ledger
    :param core_v1_api: a ``kubernetes.client.CoreV1Api``
    :param reservation_id: the grant
    :param grace_seconds: how long the grant may wait for its pod
    :param now: the time the grant is aged against (default: the ledger's clock)
    :return: why it was released, or None when it was kept (or was no live grant)
    """
    reservation = ledger.get_or_none(reservation_id)
    if reservation is None or reservation.grant is None or reservation.state.ended:
        return None
    pods = _pods_by_reservation(core_v1_api, f"{RESERVATION_LABEL}={reservation_id}")
    reason = _verdict(
        reservation, pods.get(reservation_id, []), ledger.now() if now is None else now, grace_seconds
    )
    if reason is None or not ledger.release(reservation_id, reason=f"reconcile: {reason}").released:
        return None
    return reason


# -- CLI ---------------------------------------------------------------------------------------


def _cluster_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help="ledger URL (default: GPUPOOL_LEDGER_URL, [gpupool] ledger_url, or SQLite under AIRFLOW_HOME)",
    )
    parser.add_argument(
        "--kubeconfig", metavar="F", help="kubeconfig file (default: KUBECONFIG, ~/.kube/config, in-cluster)"
    )
    parser.add_argument("--context", metavar="C", help="kubeconfig context (default: the current one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _api_errors() -> tuple[type[BaseException], ...]:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    return ApiException, HTTPError


def _gpu_cell(node: NodeInventory) -> str:
    whole = sum(1 for g in node.gpus if not g.mig_slices)
    slices = [s.profile for g in node.gpus for s in g.mig_slices]
    model = node.gpus[0].model if node.gpus else "-"
    mig = f" + MIG {len(slices)}x" + "/".join(sorted(set(slices))) if slices else ""
    return f"{whole} {model}{mig}"


def cmd_inventory_sync(args: argparse.Namespace) -> int:
    """Read the cluster's GPU nodes (GPUs, MIG slices, GFD labels, taints, cordons, pools) into the ledger."""
    from airflow_gpupool.ledger import Ledger

    api = core_v1_api(args.kubeconfig, args.context)
    url = settings.ledger_url(args.url)
    ledger = Ledger.create(url) if args.init else Ledger(url)
    try:
        result = sync_inventory(
            ledger,
            api,
            prune=args.prune,
            keep_cpu_nodes=args.keep_cpu_nodes,
            tolerated_taints={GPU_RESOURCE, *(args.tolerate_taint or ())},
        )
    except _api_errors() as e:
        raise GpuPoolError(f"cannot list nodes: {e}") from e
    finally:
        ledger.close()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        return 1 if result.errors else 0
    outcome = {n: "added" for n in result.added} | {n: "updated" for n in result.updated}
    rows = [
        (n.name, n.node_pool, n.health.value, _gpu_cell(n), outcome.get(n.name, "unchanged"))
        for n in result.nodes
    ]
    widths = [
        max([len(h)] + [len(r[i]) for r in rows])
        for i, h in enumerate(("NODE", "POOL", "HEALTH", "GPUS", "SYNC"))
    ]
    for row in [("NODE", "POOL", "HEALTH", "GPUS", "SYNC"), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print(f"inventory from Kubernetes: {result.summary()}")
    for name, message in result.errors:
        print(f"  {name}: {message}")
    return 1 if result.errors else 0


def register_sync(subparsers: Any) -> None:
    """Add ``gpupool inventory sync``.

    :param subparsers: the ``inventory`` sub-command's subparsers
    """
    p = subparsers.add_parser(
        "sync", help="read GPU nodes from Kubernetes into the ledger", description=cmd_inventory_sync.__doc__
    )
    _cluster_args(p)
    p.add_argument(
        "--no-prune",
        dest="prune",
        action="store_false",
        help="keep ledger nodes that the cluster does not list (a shared ledger, a static inventory)",
    )
    p.add_argument("--keep-cpu-nodes", action="store_true", help="also store nodes without GPUs")
    p.add_argument(
        "--tolerate-taint",
        action="append",
        metavar="KEY",
        help="taint key GPU pods tolerate (repeatable; nvidia.com/gpu always)",
    )
    p.add_argument(
        "--no-init", dest="init", action="store_false", help="fail if the ledger does not exist yet"
    )
    p.set_defaults(func=cmd_inventory_sync)


def cmd_reconcile(args: argparse.Namespace) -> int:
    """Release grants whose pods finished or never appeared (pods labelled gpupool.io/reservation-id)."""
    from airflow_gpupool.ledger import Ledger

    api = core_v1_api(args.kubeconfig, args.context)
    ledger = Ledger(settings.ledger_url(args.url))
    try:
        result = reconcile(
            ledger, api, grace_seconds=args.grace_seconds, all_nodes=args.all_nodes, id_prefix=args.id_prefix
        )
    except _api_errors() as e:
        raise GpuPoolError(f"cannot list pods or nodes: {e}") from e
    finally:
        ledger.close()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        return 0
    print(f"reconcile: {result.summary()}")
    for rid, reason in result.released:
        print(f"  released {rid}: {reason}")
    return 0


def register_reconcile(subparsers: Any) -> None:
    """Add ``gpupool reconcile``.

    :param subparsers: the top-level subparsers
    """
    p = subparsers.add_parser(
        "reconcile", help="release grants whose pods are gone or finished", description=cmd_reconcile.__doc__
    )
    _cluster_args(p)
    p.add_argument(
        "--grace-seconds",
        type=float,
        default=DEFAULT_GRACE_SECONDS,
        help="how long a grant may wait for its pod (default %(default)g)",
    )
    p.add_argument(
        "--all-nodes",
        action="store_true",
        help="also judge grants on nodes this cluster does not have (one cluster per ledger)",
    )
    p.add_argument(
        "--id-prefix", help="judge only reservations whose id starts with this (gp-: GpuPodOperator's)"
    )
    p.set_defaults(func=cmd_reconcile)
