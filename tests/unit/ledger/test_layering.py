"""Imports inside the ledger run one way: each module uses only the layers below its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import airflow_gpupool.ledger

PACKAGE = "airflow_gpupool.ledger"
FOLDER = Path(airflow_gpupool.ledger.__file__).parent
# Bottom up. Modules of one layer don't import each other either.
LAYERS = [
    {"schema", "models", "engine", "equivalence", "service", "agent_report", "gate"},
    {"statements", "pg_functions", "invariants", "concurrent", "notify"},
    {"migrations", "cache", "queue_copy"},
    {"records"},
    {"store"},
    {"explain", "take", "admission"},
    {"gangs", "preempting"},
    {"waiting", "holds", "hand_over"},
    {"cycle"},
    {"heartbeats"},
    {"health"},
    {"inventory", "grants", "views", "grant_reports"},
    {"concurrent_grants"},
    {"ledger"},
    {"attempts", "quotas", "shared"},
    {"usage"},
    {"history"},  # pruning carries per-team preemption losses over (usage.carry_preemption_losses)
    {"__init__"},
]
RANK = {module: rank for rank, layer in enumerate(LAYERS) for module in layer}


def ledger_imports(path: Path) -> set[str]:
    """The ledger modules ``path`` imports, anywhere in it (type-only and function-local included)."""
    out: set[str] = set()
    for stmt in ast.walk(ast.parse(path.read_text())):
        if isinstance(stmt, ast.Import):
            names = [a.name for a in stmt.names]
        elif isinstance(stmt, ast.ImportFrom) and stmt.module:
            names = [stmt.module] if stmt.module != PACKAGE else [f"{PACKAGE}.{a.name}" for a in stmt.names]
        else:
            continue
        for name in names:
            if name.startswith(f"{PACKAGE}."):
                module = name.removeprefix(f"{PACKAGE}.").split(".")[0]
                out.add(module if (FOLDER / f"{module}.py").exists() else "__init__")
    return out


def test_every_ledger_module_has_a_layer() -> None:
    assert {p.stem for p in FOLDER.glob("*.py")} == set(RANK)


@pytest.mark.parametrize("module", sorted(RANK))
def test_a_module_imports_only_layers_below_its_own(module: str) -> None:
    upward = {m for m in ledger_imports(FOLDER / f"{module}.py") if RANK[m] >= RANK[module]}
    assert upward == set(), f"{module} imports {sorted(upward)}, which are not below it"
