"""The Kubernetes resources the emulator serves."""

from __future__ import annotations

from kmock import resource

PODS = resource(group="", version="v1", plural="pods")
EVENTS = resource(group="", version="v1", plural="events")
NODES = resource(group="", version="v1", plural="nodes")
NAMESPACES = resource(group="", version="v1", plural="namespaces")
JOBS = resource(group="batch", version="v1", plural="jobs")
LEASES = resource(group="coordination.k8s.io", version="v1", plural="leases")
#: Dynamic Resource Allocation (Kubernetes 1.34, GA): the claims a pod's ``spec.resourceClaims`` name.
RESOURCE_CLAIMS = resource(group="resource.k8s.io", version="v1", plural="resourceclaims")
#: Pod priority: the classes a pod's ``spec.priorityClassName`` names (cluster-scoped).
PRIORITY_CLASSES = resource(group="scheduling.k8s.io", version="v1", plural="priorityclasses")
#: Pod templates (core/v1), which a ProvisioningRequest's pod sets name.
PODTEMPLATES = resource(group="", version="v1", plural="podtemplates")
#: Cluster Autoscaler's ProvisioningRequest CRD.
PROVISIONING_REQUESTS = resource(group="autoscaling.x-k8s.io", version="v1", plural="provisioningrequests")
