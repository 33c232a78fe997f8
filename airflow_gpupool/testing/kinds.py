"""The Kubernetes resources the emulator serves."""

from __future__ import annotations

from kmock import resource

PODS = resource(group="", version="v1", plural="pods")
EVENTS = resource(group="", version="v1", plural="events")
NODES = resource(group="", version="v1", plural="nodes")
NAMESPACES = resource(group="", version="v1", plural="namespaces")
LEASES = resource(group="coordination.k8s.io", version="v1", plural="leases")
