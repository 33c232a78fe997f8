"""The layering contract of pyproject.toml ([tool.importlinter]) holds, so CI enforces it without lint."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    # A contract that cannot fail proves nothing: plant one upward import in a copy of the package.
    shutil.copytree(
        ROOT / "airflow_gpupool", tmp_path / "airflow_gpupool", ignore=shutil.ignore_patterns("data")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    resources = tmp_path / "airflow_gpupool" / "resources.py"
    resources.write_text(
        resources.read_text() + "\n\ndef _upward() -> None:\n    import airflow_gpupool.ledger\n"
    )
    result = _lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "airflow_gpupool.resources -> airflow_gpupool.ledger" in result.stdout
