"""The Airflow UI plugin: the GPU pool page (GPU map, grants, queue, history) and its JSON API.

:mod:`airflow_gpupool.plugins.gpupool` holds the plugin class; importing this package
imports nothing of Airflow.
"""

from __future__ import annotations

URL_PREFIX = "/gpupool"

__all__ = ["URL_PREFIX"]
