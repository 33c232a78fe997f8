"""Kubeconfig files that point Kubernetes clients at an emulator (plain HTTP, a dummy token)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CONTEXT_NAME = "gpupool-emulator"


def kubeconfig(url: str, namespace: str = "default") -> dict[str, Any]:
    """Return a kubeconfig pointing at an emulator (plain HTTP, a dummy token).

    :param url: the server URL, e.g. ``http://127.0.0.1:8001``
    :param namespace: the context's namespace
    """
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT_NAME, "cluster": {"server": url}}],
        "users": [{"name": CONTEXT_NAME, "user": {"token": "gpupool-emulator"}}],
        "contexts": [
            {
                "name": CONTEXT_NAME,
                "context": {"cluster": CONTEXT_NAME, "user": CONTEXT_NAME, "namespace": namespace},
            }
        ],
        "current-context": CONTEXT_NAME,
        "preferences": {},
    }


def write_kubeconfig(path: str | Path, url: str, namespace: str = "default") -> Path:
    """Write a kubeconfig for an emulator.

    :param path: where
    :param url: the server URL
    :param namespace: the context's namespace
    """
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(kubeconfig(url, namespace), sort_keys=False))
    return path
