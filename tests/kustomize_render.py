"""Render ``deploy/kustomize`` as ``kubectl apply -k`` would, for the deployment tests.

The base's ``ledger.env`` is a credential a deployment writes (git ignores it): a copy of the tree
gets the committed example instead, so the rendering never reads a real URL.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.skips import skip_or_fail

ROOT = Path(__file__).resolve().parents[1]
KUSTOMIZE = ROOT / "deploy" / "kustomize"
OVERLAYS = sorted(p.name for p in (KUSTOMIZE / "overlays").iterdir() if p.is_dir())


def copy_tree(into: Path) -> Path:
    """Copy ``deploy/kustomize`` into a folder with the example ledger URL; return the copy."""
    tree = into / "kustomize"
    shutil.copytree(KUSTOMIZE, tree, ignore=shutil.ignore_patterns("ledger.env"))
    shutil.copy(tree / "base" / "ledger.env.example", tree / "base" / "ledger.env")
    return tree


@cache
def _kubectl() -> str:
    """Return a kubectl whose kustomize is v5 (``labels:``, components), else skip (fail under CI)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        skip_or_fail("kubectl is not installed (it renders the kustomize overlays)", what="the deploy tests")
    done = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True)
    version = json.loads(done.stdout or "{}").get("kustomizeVersion", "none")
    if not version.startswith("v5."):
        skip_or_fail(
            f"kubectl's kustomize is {version}: the overlays need v5 (kubectl 1.27 or newer)",
            what="the deploy tests",
        )
    return kubectl


def render(folder: Path) -> list[dict[str, Any]]:
    """Return the objects ``kubectl kustomize folder`` renders."""
    kubectl = _kubectl()
    done = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """Return the objects of one kind by name."""
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}
