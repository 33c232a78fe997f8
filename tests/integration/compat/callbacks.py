"""A KubernetesPodOperator callback class that records which hooks ran, in order (for the compat suite)."""

from __future__ import annotations

from typing import Any

from airflow.providers.cncf.kubernetes.callbacks import KubernetesPodOperatorCallback

#: The callback names seen since the last clear, in order.
CALLS: list[str] = []


class RecordingCallback(KubernetesPodOperatorCallback):
    """Record each callback KubernetesPodOperator makes (by name; the pod and client are not kept)."""

    @staticmethod
    def on_sync_client_creation(*, client: Any, operator: Any, **kwargs: Any) -> None:
        CALLS.append("on_sync_client_creation")

    @staticmethod
    def on_pod_manifest_created(*, pod_request: Any, **kwargs: Any) -> None:
        CALLS.append("on_pod_manifest_created")

    @staticmethod
    def on_pod_creation(*, pod: Any, client: Any, mode: str, **kwargs: Any) -> None:
        CALLS.append(f"on_pod_creation:{mode}")

    @staticmethod
    def on_pod_starting(*, pod: Any, client: Any, mode: str, **kwargs: Any) -> None:
        CALLS.append(f"on_pod_starting:{mode}")

    @staticmethod
    def on_pod_completion(*, pod: Any, client: Any, mode: str, **kwargs: Any) -> None:
        CALLS.append(f"on_pod_completion:{mode}")

    @staticmethod
    def on_pod_teardown(*, pod: Any, client: Any, mode: str, **kwargs: Any) -> None:
        CALLS.append(f"on_pod_teardown:{mode}")

    @staticmethod
    def on_pod_cleanup(*, pod: Any, client: Any, mode: str, **kwargs: Any) -> None:
        CALLS.append(f"on_pod_cleanup:{mode}")

    @staticmethod
    def on_operator_resuming(
        *, pod: Any, event: dict[str, Any], client: Any, mode: str, **kwargs: Any
    ) -> None:
        CALLS.append(f"on_operator_resuming:{mode}:{event.get('status')}")
