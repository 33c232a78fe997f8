"""The Airflow plugin: mounts the GPU pool app at ``/gpupool`` and adds "GPU pool" to the navigation."""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_gpupool.plugins import URL_PREFIX


class _LazyApp:
    """An ASGI app that builds the GPU pool app on its first request.

    Plugins are loaded by every Airflow component; only the API server serves requests,
    so the FastAPI app (and Airflow's security module it imports) is built only there.
    """

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from airflow_gpupool.plugins.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class GpuPoolPlugin(AirflowPlugin):
    """The GPU pool page, its JSON API and ``/gpupool/metrics`` in the Airflow 3 UI."""

    name = "gpupool"
    fastapi_apps = [{"app": _LazyApp(), "url_prefix": URL_PREFIX, "name": "GPU pool"}]
    external_views = [
        {
            "name": "GPU pool",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "category": "browse",
            "url_route": "gpupool",
        }
    ]
