"""The layering contract of pyproject.toml ([tool.importlinter]) holds, so CI enforces it without lint."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.skips import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    try:
        import importlinter  # noqa: F401
    except ImportError:
        skip_or_fail(
            "import-linter is not installed (pip install -e '.[lint]')", what="the layering contract"
        )
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", LINT], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


def test_imports_run_downward_only() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def _copy_with(tmp_path: Path, module: str, planted: str) -> Path:
    """Copy the package and pyproject.toml into ``tmp_path``, with ``planted`` added to ``module``'s file."""
    shutil.copytree(
        ROOT / "airflow_gpupool", tmp_path / "airflow_gpupool", ignore=shutil.ignore_patterns("data")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    path = tmp_path / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n\ndef _planted() -> None:\n    {planted}\n")
    return tmp_path


LAYERS = "Layers: imports run downward only"
ROOMS = "The ledger's rooms: imports run downward only"
ACYCLIC = "Inside a room, no module imports one that imports it back"
DOOR = "The ledger's only door is airflow_gpupool.ledger (its __all__)"

# A contract that cannot fail proves nothing: plant one break of each in a copy of the package.
# Each case: the module changed, the line planted in it, the contracts it must break (an upward
# import also closes paths through lower rooms, or a cycle between rooms), a line the report shows.
PLANTED = {
    "upward between layers": (
        "airflow_gpupool.resources",
        "import airflow_gpupool.ledger",
        {LAYERS, ROOMS},
        "airflow_gpupool.resources -> airflow_gpupool.ledger",
    ),
    "upward between the ledger's rooms": (
        "airflow_gpupool.ledger.db.engine",
        "import airflow_gpupool.ledger.queue.cycle",
        {ROOMS, ACYCLIC},
        "airflow_gpupool.ledger.db.engine -> airflow_gpupool.ledger.queue.cycle",
    ),
    "a cycle inside a room": (
        "airflow_gpupool.ledger.store.cache",
        "import airflow_gpupool.ledger.store.transactions",
        {ACYCLIC},
        "No cycles are allowed in airflow_gpupool.ledger.store.",
    ),
    "a room imported from outside the ledger": (
        "airflow_gpupool.operators.gpu_pod",
        "from airflow_gpupool.ledger.db.models import Grant",
        {DOOR},
        "airflow_gpupool.operators.gpu_pod -> airflow_gpupool.ledger.db.models",
    ),
}


def _broken(report: str) -> set[str]:
    return {line.split(" BROKEN")[0] for line in report.splitlines() if " BROKEN" in line}


def test_every_contract_is_planted_once() -> None:
    assert set().union(*(broken for _, _, broken, _ in PLANTED.values())) == {LAYERS, ROOMS, ACYCLIC, DOOR}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_planted_break_breaks_its_contract(tmp_path: Path, case: str) -> None:
    module, planted, broken, shown = PLANTED[case]
    result = _lint_imports(_copy_with(tmp_path, module, planted))
    assert result.returncode == 1, result.stdout + result.stderr
    assert _broken(result.stdout) == broken, result.stdout
    assert shown in result.stdout, result.stdout
