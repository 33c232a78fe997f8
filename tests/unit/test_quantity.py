"""The one quantity parser: what Kubernetes accepts, exactly, and nothing else."""

from __future__ import annotations

from decimal import Decimal

import pytest

from airflow_gpupool.quantity import cpu_milli, memory_mib, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2", Decimal(2)),
        ("0.1", Decimal("0.1")),
        ("500m", Decimal("0.5")),
        (".5", Decimal("0.5")),
        ("1e3", Decimal(1000)),
        ("1E-3", Decimal("0.001")),
        ("1Ki", Decimal(1024)),
        ("80Gi", Decimal(80 * 1024**3)),
        ("1G", Decimal(10**9)),
        ("100u", Decimal("0.0001")),
        (3, Decimal(3)),
        (0.25, Decimal("0.25")),
    ],
)
def test_parses_kubernetes_quantities_exactly(text: object, expected: Decimal) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    ("value", "milli"), [("64", 64000), ("0.5", 500), ("63500m", 63500), ("0.1", 100), (2, 2000)]
)
def test_cpu_in_milli_cores(value: object, milli: int) -> None:
    assert cpu_milli(value) == milli


@pytest.mark.parametrize(
    ("value", "mib"), [("80Gi", 81920), ("512Mi", 512), ("1G", 953), (1024**3, 1024), ("2048Ki", 2)]
)
def test_memory_in_mib(value: object, mib: int) -> None:
    assert memory_mib(value) == mib


@pytest.mark.parametrize("bad", ["", "-1", "abc", "1mi", "1Kb", "5 Gi", "1.2.3", None, True, [1]])
def test_refuses_what_kubernetes_refuses(bad: object) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(bad)
