"""Inventory from a Kubernetes cluster: its GPU nodes into the ledger, nodes that left it drained.

:func:`sync_inventory` upserts every GPU node of a cluster (read by
:func:`~airflow_gpupool.inventory.nodes.node_from_kubernetes`) and removes or drains ledger nodes
the cluster no longer lists; :func:`core_v1_api` and :func:`list_objects` are the only places that
talk to the API server.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_gpupool.exceptions import ConfigurationError, InvalidInventoryError
from airflow_gpupool.inventory.nodes import DEFAULT_TOLERATED_TAINTS, node_from_kubernetes, node_name
from airflow_gpupool.resources import NodeInventory

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger

__all__ = [
    "SyncResult",
    "core_v1_api",
    "list_nodes",
    "list_objects",
    "resync_suspect_nodes",
    "sync_inventory",
]

log = logging.getLogger(__name__)

_PAGE = 500


def core_v1_api(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """Build a ``CoreV1Api``: from a kubeconfig, or in-cluster when none is given inside a pod.

    :param kubeconfig: kubeconfig file (default: ``KUBECONFIG`` or ``~/.kube/config``)
    :param context: kubeconfig context (default: its current context)
    :raises ConfigurationError: no usable configuration
    """
    import yaml
    from kubernetes import client, config

    if kubeconfig is not None and not os.path.isfile(kubeconfig):
        raise ConfigurationError(
            f"cannot configure a Kubernetes client: no kubeconfig file at {kubeconfig!r}"
        )
    try:
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.CoreV1Api(client.ApiClient(configuration))
        return client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig, context=context))
    except config.ConfigException as e:
        raise ConfigurationError(f"cannot configure a Kubernetes client: {e}") from e
    except (OSError, yaml.YAMLError, ValueError, TypeError, AttributeError, KeyError) as e:
        # The client's loader fails on a file that is not a kubeconfig with whatever its parsing hit.
        shown = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ConfigurationError(
            f"cannot configure a Kubernetes client: {shown!r} is not a kubeconfig file ({type(e).__name__})"
        ) from e


def list_objects(method: Callable[..., Any], **kwargs: Any) -> Iterator[dict[str, Any]]:
    """List objects page by page as plain JSON (V1Node models are slow to build by the thousand).

    :param method: a ``CoreV1Api`` list method, such as ``api.list_node``
    :param kwargs: passed to every call (``label_selector``)
    """
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
    return list(list_objects(api.list_node))


@dataclass(frozen=True)
class SyncResult:
    """What one inventory sync did, by node name.

    :param drained: nodes gone from Kubernetes that still hold grants: draining, removed once released
    :param removed: nodes gone from Kubernetes, removed from the ledger
    :param errors: ``(node, message)`` for nodes that could not be read or stored; left as they were
    :param nodes: the GPU nodes read from Kubernetes
    :param cleared: suspect nodes this sync read again, no longer suspect (see
        :mod:`~airflow_gpupool.ledger.nodes.suspects`)
    """

    added: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    drained: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    errors: tuple[tuple[str, str], ...] = ()
    nodes: tuple[NodeInventory, ...] = field(default=(), repr=False)
    cleared: tuple[str, ...] = ()

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
        if self.cleared:
            parts.append(f"{', '.join(self.cleared)} no longer suspect")
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
            "cleared": list(self.cleared),
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
    read_at = ledger.now()  # a suspect node marked after this read stays suspect
    objects: Iterable[Any] = list_nodes(source) if hasattr(source, "list_node") else source
    inventory: list[NodeInventory] = []
    errors: list[tuple[str, str]] = []
    for obj in objects:
        name = node_name(obj)
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
    cleared = ledger.clear_suspect_nodes([*added, *updated, *unchanged], read_at=read_at)
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
        tuple(cleared),
    )


def resync_suspect_nodes(ledger: Ledger, api: Any, **options: Any) -> SyncResult | None:
    """Sync the nodes the ledger holds suspect, now, and clear them; None (one read) when none is.

    The controller calls it every pass, so a node a granted pod found wrong is read again within
    seconds instead of at the next full sync. A suspect node Kubernetes no longer has is left to
    the full sync, which prunes it.

    :param ledger: the ledger
    :param api: a ``CoreV1Api``
    :param options: :func:`sync_inventory`'s ``keep_cpu_nodes`` and ``tolerated_taints``
    """
    from kubernetes.client.exceptions import ApiException

    suspects = sorted(ledger.suspect_nodes())
    if not suspects:
        return None
    objects = []
    for name in suspects:
        try:
            objects.append(json.loads(api.read_node(name, _preload_content=False).data))
        except ApiException as e:
            if e.status != 404:
                raise
            log.warning("Suspect node %s is gone from Kubernetes; the next full sync removes it", name)
    return sync_inventory(ledger, objects, prune=False, **options)


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
