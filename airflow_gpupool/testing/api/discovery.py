"""API discovery for the emulator: what it serves, described the way ``kubectl`` reads it.

``kubectl`` resolves ``get nodes`` through discovery before it sends a single request for
objects: ``/api`` (``APIVersions``), ``/api/v1`` and ``/apis/<group>/<version>``
(``APIResourceList``, whose ``groupVersion`` is ``v1`` for the core group), ``/apis``
(``APIGroupList``) and ``/version``. kmock 0.8 writes the core group version as ``/v1``, which
``kubectl`` rejects ("the server doesn't have a resource type"), and calls itself k3s; this
module is the one list of served resources, used both to register them with kmock and to
answer discovery.

The version is honest: the emulator serves the core objects of Kubernetes
:data:`EMULATED_MINOR` (the level the nodes' kubelets report) and says in ``gitVersion``,
``compiler`` and ``platform`` that it is this Python emulator, not a Go API server.
"""

from __future__ import annotations

import dataclasses
import platform
from typing import Any

from airflow_gpupool import __version__

EMULATED_MAJOR = "1"
EMULATED_MINOR = "30"
KUBELET_VERSION = f"v{EMULATED_MAJOR}.{EMULATED_MINOR}.0"
"""What the emulated nodes report as ``status.nodeInfo.kubeletVersion``."""


#: Cluster Autoscaler's API group (the ProvisioningRequest CRD), absent from clusters without it.
AUTOSCALING_GROUP = "autoscaling.x-k8s.io"
#: Karpenter's API group (NodePools, stored as sent), served only when a test asks for it.
KARPENTER_GROUP = "karpenter.sh"
#: Cluster API's group (MachineDeployments and MachineSets, stored as sent: Cluster Autoscaler's
#: node groups on the clusterapi provider), served only when a test asks for it.
CLUSTER_API_GROUP = "cluster.x-k8s.io"
#: The groups an emulated cluster lacks unless told otherwise: it runs Cluster Autoscaler, not
#: Karpenter, on a cloud provider, not Cluster API.
UNSERVED_BY_DEFAULT = (KARPENTER_GROUP, CLUSTER_API_GROUP)


@dataclasses.dataclass(frozen=True)
class ServedResource:
    """One resource the emulator serves.

    :param group: API group, ``""`` for the core group
    :param version: API version
    :param plural: plural name, as in URLs
    :param kind: object kind
    :param namespaced: whether objects live in a namespace
    :param short_names: ``kubectl`` abbreviations (``po``, ``no``...)
    :param subresources: e.g. ``("log", "status")``
    :param verbs: the verbs served
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ("create", "delete", "get", "list", "patch", "update", "watch")

    @property
    def group_version(self) -> str:
        """``v1`` for the core group, ``<group>/<version>`` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        """The singular name (``kubectl get pod`` works as well as ``get pods``)."""
        return self.kind.lower()


SERVED: tuple[ServedResource, ...] = (
    ServedResource("", "v1", "pods", "Pod", True, ("po",), ("log", "status")),
    ServedResource("", "v1", "events", "Event", True, ("ev",)),
    ServedResource("", "v1", "nodes", "Node", False, ("no",), ("status",)),
    ServedResource("", "v1", "namespaces", "Namespace", False, ("ns",)),
    ServedResource("batch", "v1", "jobs", "Job", True, (), ("status",)),
    ServedResource("coordination.k8s.io", "v1", "leases", "Lease", True),
    ServedResource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, (), ("status",)),
    ServedResource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, ("pc",)),
    ServedResource("", "v1", "podtemplates", "PodTemplate", True),
    ServedResource(
        AUTOSCALING_GROUP,
        "v1",
        "provisioningrequests",
        "ProvisioningRequest",
        True,
        ("provreq",),
        ("status",),
    ),
    ServedResource(KARPENTER_GROUP, "v1", "nodepools", "NodePool", False, (), ("status",)),
    ServedResource(
        CLUSTER_API_GROUP, "v1beta1", "machinedeployments", "MachineDeployment", True, ("md",), ("status",)
    ),
    ServedResource(CLUSTER_API_GROUP, "v1beta1", "machinesets", "MachineSet", True, ("ms",), ("status",)),
)


def served(without: frozenset[str] = frozenset()) -> tuple[ServedResource, ...]:
    """Return the served resources, less the API groups a cluster does not serve.

    :param without: API groups left out (``autoscaling.x-k8s.io`` for a cluster without Cluster
        Autoscaler's ProvisioningRequest CRD)
    """
    return tuple(res for res in SERVED if res.group not in without)


def kmock_resources(resources: tuple[ServedResource, ...] = SERVED) -> dict[str, dict[str, Any]]:
    """Return the resources as kmock's ``resources`` registry takes them (``"<group>/<version>/<plural>"`` keys).

    :param resources: the served resources
    """
    return {
        f"{res.group_version}/{res.plural}": {
            "namespaced": res.namespaced,
            "kind": res.kind,
            "singular": res.singular,
            "verbs": list(res.verbs),
            "shortnames": list(res.short_names),
            "categories": ["all"] if res.plural == "pods" else [],
            "subresources": list(res.subresources),
        }
        for res in resources
    }


def server_version() -> dict[str, str]:
    """Return the ``/version`` document."""
    return {
        "major": EMULATED_MAJOR,
        "minor": EMULATED_MINOR,
        "gitVersion": f"{KUBELET_VERSION}-gpupool-emulator.{__version__}",
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "goVersion": "",
        "compiler": "python",
        "platform": f"{platform.system().lower()}/{platform.machine()} (python {platform.python_version()})",
    }


def _resource_entries(res: ServedResource) -> list[dict[str, Any]]:
    """Return the ``APIResourceList`` entries of a resource and its subresources.

    :param res: the resource
    """
    entries = [
        {
            "name": res.plural,
            "singularName": res.singular,
            "namespaced": res.namespaced,
            "kind": res.kind,
            "verbs": list(res.verbs),
            "shortNames": list(res.short_names),
            "categories": ["all"] if res.plural == "pods" else [],
        }
    ]
    for sub in res.subresources:
        verbs = ["get"] if sub == "log" else ["get", "patch", "update"]
        entries.append(
            {
                "name": f"{res.plural}/{sub}",
                "singularName": "",
                "namespaced": res.namespaced,
                "kind": res.kind,
                "verbs": verbs,
            }
        )
    return entries


def resource_list(
    group: str, version: str, resources: tuple[ServedResource, ...] = SERVED
) -> dict[str, Any] | None:
    """Return the ``APIResourceList`` of a group version, or ``None`` when it is not served.

    :param group: ``""`` for the core group
    :param version: e.g. ``v1``
    :param resources: the served resources
    """
    served = [res for res in resources if res.group == group and res.version == version]
    if not served:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": served[0].group_version,
        "resources": [entry for res in served for entry in _resource_entries(res)],
    }


def _group(name: str, resources: tuple[ServedResource, ...]) -> dict[str, Any]:
    """Return the ``APIGroup`` entry of a group.

    :param name: the group
    :param resources: the served resources
    """
    versions = sorted({res.version for res in resources if res.group == name})
    listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": listed, "preferredVersion": listed[0]}


def api_group(name: str, resources: tuple[ServedResource, ...] = SERVED) -> dict[str, Any] | None:
    """Return the ``APIGroup`` document of ``/apis/<group>``, or ``None``.

    :param name: the group
    :param resources: the served resources
    """
    if not name or name not in {res.group for res in resources}:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, resources)}


def discovery_document(path: str, resources: tuple[ServedResource, ...] = SERVED) -> dict[str, Any] | None:
    """Return the discovery document for a path, or ``None`` when the path is not discovery.

    :param path: URL path, e.g. ``/api/v1``
    :param resources: the served resources
    """
    parts = [p for p in path.split("/") if p]
    if parts == ["version"]:
        return server_version()
    if parts == ["api"]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
        }
    if parts == ["apis"]:
        groups = sorted({res.group for res in resources if res.group})
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [_group(g, resources) for g in groups],
        }
    if len(parts) == 2 and parts[0] == "api":
        return resource_list("", parts[1], resources) or not_found(path)
    if len(parts) == 2 and parts[0] == "apis":
        return api_group(parts[1], resources) or not_found(path)
    if len(parts) == 3 and parts[0] == "apis":
        return resource_list(parts[1], parts[2], resources) or not_found(path)
    return None


def not_found(what: str, name: str | None = None) -> dict[str, Any]:
    """Return a 404 ``Status`` worded as the API server words it.

    :param what: the resource's plural name, or the path when ``name`` is ``None``
    :param name: the missing object's name
    """
    message = (
        f'{what} "{name}" not found' if name else f"the server could not find the requested resource ({what})"
    )
    status: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "status": "Failure"}
    status.update(reason="NotFound", code=404, message=message)
    if name:
        status["details"] = {"name": name, "kind": what}
    return status
