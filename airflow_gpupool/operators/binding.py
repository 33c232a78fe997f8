"""The slice-binding strategies, under the operators' name (they live in :mod:`airflow_gpupool.binding`)."""

from __future__ import annotations

from airflow_gpupool.binding import (
    BINDINGS,
    DevicePinningBinding,
    HamiBinding,
    KaiBinding,
    MigBinding,
    PodBinding,
    SliceBinding,
    SliceFacts,
    WholeGpuBinding,
    binding_for,
    check_binding_name,
)

__all__ = [
    "BINDINGS",
    "DevicePinningBinding",
    "HamiBinding",
    "KaiBinding",
    "MigBinding",
    "PodBinding",
    "SliceBinding",
    "SliceFacts",
    "WholeGpuBinding",
    "binding_for",
    "check_binding_name",
]
