"""Waiting demand made visible to the cluster's autoscaler: scalable pools, demand, and the step that asks."""

from __future__ import annotations
