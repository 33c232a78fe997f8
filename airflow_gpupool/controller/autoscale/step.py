"""The controller's autoscale step: ask the cluster's autoscaler for the nodes waiting requests need.

Each pass reads the ledger's waiting requests and the objects earlier passes made (found by
:data:`~airflow_gpupool.labels.SCALE_UP_LABEL`, so a restarted controller picks up where the last
one stopped, and nothing is kept in memory), then:

1. deletes the objects of every reservation no longer waiting: granted, cancelled, timed out,
   or gone (every exit path, whatever ended it);
2. keeps those of reservations still waiting (a ProvisioningRequest's spec is immutable, and a
   node that appeared is not lost to a request granted a pass later);
3. creates objects for the new scale-ups :func:`~.demand.scale_ups` finds, one set per
   reservation id (a create answered 409 means a replica or an earlier pass made it: idempotent).

How it asks: a ``ProvisioningRequest`` when the cluster serves ``autoscaling.x-k8s.io/v1`` (read
from discovery each pass) and the mode allows, else placeholder pods at a negative priority.

Each pass also stores the pools' empty nodes in the ledger
(:class:`~airflow_gpupool.ledger.LedgerScalablePools`, written only when they change), so a
reserve in any process lets a request that only a new node fits wait instead of refusing it.
With nothing to ask (mode ``off``, no pool) none is stored: such a request is refused at once.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_gpupool.controller.autoscale import cluster_api, karpenter, manifests
from airflow_gpupool.controller.autoscale.demand import Waiting, scale_ups
from airflow_gpupool.controller.autoscale.pools import ScalablePool, empty_node
from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.labels import POOL_LABEL, SCALE_UP_LABEL
from airflow_gpupool.ledger import LedgerScalablePools, ScalableShape
from airflow_gpupool.placement.pools import UNCONSTRAINED, PoolBindings

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger, Reservation
    from airflow_gpupool.placement import NodeState

__all__ = ["MODES", "AutoscaleResult", "AutoscaleSettings", "Autoscaler", "waiting_demand"]

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
PROVISIONING_REQUEST, PLACEHOLDER_PODS = "provisioning-request", "placeholder-pods"
#: ``auto``: a ProvisioningRequest where served, else placeholder pods; ``off``: ask nothing
#: (and delete what earlier passes made).
MODES = ("auto", PROVISIONING_REQUEST, PLACEHOLDER_PODS, "off")


@dataclass(frozen=True)
class AutoscaleSettings:
    """How the step asks for nodes.

    :param pools: the scalable pools, preferred in this order
    :param namespace: where its objects live
    :param mode: one of :data:`MODES`
    :param provisioning_class: the ProvisioningRequest class
    :param placeholder_priority_class: the PriorityClass of placeholder pods (created if missing)
    :param spot_pools: node pools configured as spot
    :param bindings: the slice binding of each node pool
    :param discover_karpenter: add the pools Karpenter ``NodePool``s declare
        (:mod:`~airflow_gpupool.controller.autoscale.karpenter`) after the configured ones
    :param discover_cluster_api: add the pools Cluster Autoscaler's node groups on Cluster API
        declare (:mod:`~airflow_gpupool.controller.autoscale.cluster_api`) after those
    """

    pools: tuple[ScalablePool, ...] = ()
    namespace: str = "default"
    mode: str = "auto"
    provisioning_class: str = manifests.BEST_EFFORT_ATOMIC
    placeholder_priority_class: str = "gpupool-placeholder"
    spot_pools: frozenset[str] = frozenset()
    bindings: PoolBindings = UNCONSTRAINED
    discover_karpenter: bool = False
    discover_cluster_api: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigurationError(f"[gpupool] autoscale_mode: {self.mode!r} is not one of {list(MODES)}")
        classes = (manifests.BEST_EFFORT_ATOMIC, manifests.CHECK_CAPACITY)
        if self.provisioning_class not in classes:
            raise ConfigurationError(
                f"[gpupool] provisioning_class: {self.provisioning_class!r} is not one of {list(classes)}"
            )


@dataclass
class AutoscaleResult:
    """What one pass did.

    :param method: ``provisioning-request``, ``placeholder-pods`` or ``None`` (off)
    :param created: reservation ids asked for now
    :param deleted: reservation ids whose objects were deleted
    :param kept: reservation ids still asked for
    """

    method: str | None
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """Return one line, such as ``2 asked, 1 ended (provisioning-request)``."""
        return f"{len(self.created)} asked, {len(self.deleted)} ended, {len(self.kept)} kept ({self.method})"


def waiting_demand(queue: Sequence[Reservation]) -> list[Waiting]:
    """Return the waiting demand, a gang as one entry keyed by its leader.

    A gang waits as one entry (its leader) and is granted its ``min_members`` all or nothing, so
    it asks for that many pods: never more than the grant needs.

    :param queue: the ledger's waiting reservations, in queue order
    """
    gangs: dict[str, list[Reservation]] = defaultdict(list)
    order: list[str] = []
    for reservation in queue:
        key = reservation.gang_id or reservation.id
        if key not in gangs:
            order.append(key)
        gangs[key].append(reservation)
    out = []
    for key in order:
        request = gangs[key][0].request
        members = request.gang.min_members if request.gang is not None else 1
        out.append(Waiting(key, request, max(members, len(gangs[key]))))
    return out


class Autoscaler:
    """One autoscale pass per call.

    :param ledger: the ledger
    :param core_v1_api: a ``kubernetes.client.CoreV1Api`` (its API client serves the other groups)
    :param settings: how to ask
    """

    def __init__(self, ledger: Ledger, core_v1_api: Any, settings: AutoscaleSettings) -> None:
        from kubernetes import client

        self.ledger = ledger
        self.core = core_v1_api
        self.custom = client.CustomObjectsApi(core_v1_api.api_client)
        self.apis = client.ApisApi(core_v1_api.api_client)
        self.scheduling = client.SchedulingV1Api(core_v1_api.api_client)
        self.settings = settings
        self._pools = tuple((pool, empty_node(pool, settings.spot_pools)) for pool in settings.pools)

    def __call__(self) -> AutoscaleResult:
        """Run one pass: delete what ended, keep what waits, create what new demand needs."""
        groups = self._served_groups()
        served = f"{GROUP}/{VERSION}" in groups
        found = self._discovered(groups)
        pools = self._pools + tuple((p, n) for p, n, _ in found)
        method = self._method(served, bool(pools))
        sources = [(p, n, "config") for p, n in self._pools] + list(found)
        shapes = [ScalableShape(p.name, source, n) for p, n, source in sources] if method else []
        LedgerScalablePools(self.ledger).replace(shapes)
        snapshot = self.ledger.snapshot()
        waiting = waiting_demand(snapshot.queue)
        still = {w.key for w in waiting} if method is not None else set()
        existing = self._existing(served)
        result = AutoscaleResult(method)
        for key, kinds in sorted(existing.items()):
            if key in still and method in kinds:
                result.kept.append(key)
            else:
                self._delete(key, kinds)
                result.deleted.append(key)
        if method is None:
            return result
        fresh = [w for w in waiting if w.key not in result.kept]
        for scale_up in scale_ups(snapshot.cluster, fresh, pools, self.settings.bindings):
            self._create(method, scale_up.key, scale_up.pool, scale_up.request, scale_up.count)
            result.created.append(scale_up.key)
        return result

    # -- reading -------------------------------------------------------------------------------

    def _served_groups(self) -> set[str]:
        """Return the ``<group>/<version>`` the cluster serves, from discovery."""
        groups = self.apis.get_api_versions().groups or []
        return {v.group_version for g in groups for v in g.versions or []}

    def _discovered(self, groups: set[str]) -> list[tuple[ScalablePool, NodeState, str]]:
        """Return the pools Karpenter's NodePools and Cluster API's node groups declare, with their source.

        A pool whose name is taken (configured, or found earlier) is left out.
        """
        found: list[tuple[ScalablePool, str]] = []
        if self.settings.discover_karpenter and f"{karpenter.GROUP}/{karpenter.VERSION}" in groups:
            found += [
                (p, "karpenter")
                for p in karpenter.pools_from_node_pools(karpenter.list_node_pools(self.custom))
            ]
        if self.settings.discover_cluster_api and f"{cluster_api.GROUP}/{cluster_api.VERSION}" in groups:
            listed = cluster_api.list_node_groups(self.custom)
            found += [(p, "cluster-api") for p in cluster_api.pools_from_node_groups(listed)]
        taken = {pool.name for pool in self.settings.pools}
        out = []
        for pool, source in found:
            if pool.name not in taken:
                taken.add(pool.name)
                out.append((pool, empty_node(pool, self.settings.spot_pools), source))
        return out

    def _method(self, served: bool, any_pool: bool) -> str | None:
        mode = self.settings.mode
        if mode == "off" or not any_pool:
            return None
        if mode == PROVISIONING_REQUEST and not served:
            raise ConfigurationError(
                f"[gpupool] autoscale_mode is {PROVISIONING_REQUEST!r} but the cluster does not serve "
                f"{GROUP}/{VERSION} (install Cluster Autoscaler's ProvisioningRequest CRD, or use 'auto')"
            )
        if mode == PLACEHOLDER_PODS or not served:
            return PLACEHOLDER_PODS
        return PROVISIONING_REQUEST

    def _existing(self, served: bool) -> dict[str, set[str]]:
        """Return, per reservation id, how it is asked for now (both, after a mode change)."""
        found: dict[str, set[str]] = defaultdict(set)
        namespace, selector = self.settings.namespace, SCALE_UP_LABEL
        if served:
            listed = self.custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, label_selector=selector
            )
            for item in listed.get("items", []):
                found[item["metadata"]["labels"][SCALE_UP_LABEL]].add(PROVISIONING_REQUEST)
        for template in self.core.list_namespaced_pod_template(namespace, label_selector=selector).items:
            found[template.metadata.labels[SCALE_UP_LABEL]].add("template")  # a create cut short
        for pod in self.core.list_namespaced_pod(namespace, label_selector=selector).items:
            found[pod.metadata.labels[SCALE_UP_LABEL]].add(PLACEHOLDER_PODS)
        return found

    # -- writing -------------------------------------------------------------------------------

    def _create(self, method: str, key: str, pool: ScalablePool, request: Any, count: int) -> None:
        namespace = self.settings.namespace
        spec = manifests.pod_spec(request, dict(pool.labels) or {POOL_LABEL: pool.name})
        if method == PROVISIONING_REQUEST:
            _create_once(
                self.core.create_namespaced_pod_template,
                namespace,
                manifests.pod_template(key, namespace, spec),
            )
            body = manifests.provisioning_request(key, namespace, count, self.settings.provisioning_class)
            _create_once(
                lambda ns, b: self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, b),
                namespace,
                body,
            )
        else:
            self._ensure_priority_class()
            name = self.settings.placeholder_priority_class
            for pod in manifests.placeholder_pods(key, namespace, count, spec, name):
                _create_once(self.core.create_namespaced_pod, namespace, pod)
        log.info("Asked for a node of pool %s for %s (%d pod(s), %s)", pool.name, key, count, method)

    def _ensure_priority_class(self) -> None:
        from kubernetes.client.exceptions import ApiException

        name = self.settings.placeholder_priority_class
        try:
            self.scheduling.read_priority_class(name)
        except ApiException as e:
            if e.status != 404:
                raise
            _create_once(
                lambda _, b: self.scheduling.create_priority_class(b),
                None,
                manifests.placeholder_priority_class(name),
            )

    def _delete(self, key: str, kinds: set[str]) -> None:
        from kubernetes.client.exceptions import ApiException

        namespace, name = self.settings.namespace, manifests.object_name(key)
        selector = f"{SCALE_UP_LABEL}={key}"
        try:
            if PROVISIONING_REQUEST in kinds:
                self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            if PROVISIONING_REQUEST in kinds or "template" in kinds:
                self.core.delete_namespaced_pod_template(name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise
        if PLACEHOLDER_PODS in kinds:
            for pod in self.core.list_namespaced_pod(namespace, label_selector=selector).items:
                try:
                    self.core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
                except ApiException as e:
                    if e.status != 404:
                        raise
        log.info("Scale-up for %s ended: its %s deleted", key, ", ".join(sorted(kinds)))


def _create_once(create: Any, namespace: str | None, body: dict[str, Any]) -> None:
    """Create an object; one that already exists (409) is what an earlier pass or replica made."""
    from kubernetes.client.exceptions import ApiException

    try:
        create(namespace, body)
    except ApiException as e:
        if e.status != 409:
            raise
