"""The GPU pool console: a page per team and the actions an operator takes on the pool.

:func:`add_console` adds its routes to the plugin's app (:mod:`airflow_gpupool.plugins.app`):
``GET /teams/{team}``, ``GET /reservations/{id}/release`` (the release's confirmation) and
``POST /actions/{action}``. Who may act is the Airflow auth manager's answer (:mod:`.guard`).
"""

from __future__ import annotations

from airflow_gpupool.plugins.console.routes import add_console

__all__ = ["add_console"]
