"""The public errors: one package, one base class, the old homes still export them."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import airflow_gpupool
from airflow_gpupool import exceptions
from airflow_gpupool.exceptions import CorruptCheckpointError, GpuPoolError

PACKAGE = Path(airflow_gpupool.__file__).parent
ERRORS = [
    obj
    for name in exceptions.__all__
    if inspect.isclass(obj := getattr(exceptions, name)) and issubclass(obj, BaseException)
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.__name__)
def test_every_public_error_derives_from_the_base_error(error: type[BaseException]) -> None:
    assert issubclass(error, GpuPoolError)
    assert error.__module__ == "airflow_gpupool.exceptions"


def test_a_corrupt_checkpoint_is_still_a_value_error() -> None:
    error = CorruptCheckpointError("s3://ckpt/step-000001", "manifest.json is not JSON")
    assert isinstance(error, ValueError)
    assert (error.location, error.detail) == ("s3://ckpt/step-000001", "manifest.json is not JSON")


@pytest.mark.parametrize(
    ("module", "names"),
    [
        (
            "airflow_gpupool.operators.failures",
            [
                "FailureClass",
                "Classification",
                "PodFailureError",
                "OutOfMemoryError",
                "PreemptedError",
                "NodeLostError",
                "ImagePullError",
                "DeadlineExceededError",
                "ApplicationError",
                "UnknownPodFailureError",
            ],
        ),
        ("airflow_gpupool.checkpoints.manifest", ["CorruptCheckpointError"]),
        ("airflow_gpupool.checkpoints", ["CorruptCheckpointError"]),
        ("airflow_gpupool.sensors.checkpoint", ["CheckpointStalledError"]),
        ("airflow_gpupool.sensors", ["CheckpointStalledError"]),
    ],
)
def test_the_old_homes_export_the_same_classes(module: str, names: list[str]) -> None:
    imported = __import__(module, fromlist=names)
    for name in names:
        assert name in imported.__all__
        assert getattr(imported, name) is getattr(exceptions, name)


def _error_classes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
            if any(b.endswith(("Error", "Exception")) for b in bases):
                found.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    return found


def test_no_public_error_is_defined_outside_the_exceptions_package() -> None:
    # The emulator kit (testing/) answers like a Kubernetes API server and keeps its own errors.
    sources = [
        p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in ("exceptions", "testing")
    ]
    assert [c for p in sorted(sources) for c in _error_classes(p)] == []


def test_every_public_class_of_a_family_module_is_exported_from_the_package() -> None:
    # A class left out of the package's __all__ keeps its family module's name in tracebacks.
    family_modules = sorted((PACKAGE / "exceptions").glob("*.py"))
    defined = {
        node.name
        for path in family_modules
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
    }
    assert defined == set(exceptions.__all__)
    for name in exceptions.__all__:
        assert getattr(exceptions, name).__module__ == "airflow_gpupool.exceptions"
