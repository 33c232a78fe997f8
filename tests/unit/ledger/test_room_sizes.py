"""The ledger's folder shows its parts: rooms of a few modules, each saying its job, no module too long to read.

The import contracts (``pyproject.toml``, :mod:`tests.unit.test_layers`) say who may import whom;
this says how big a room and a module may grow before they are split (STYLE.md: about ten
modules a folder, about 400 lines a module).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import airflow_gpupool.ledger

LEDGER = Path(airflow_gpupool.ledger.__file__).parent
ROOMS = sorted(p.parent for p in LEDGER.glob("*/__init__.py"))
MAX_MODULES_PER_ROOM = 10
MAX_LINES_PER_MODULE = 400


def test_the_ledger_has_its_rooms() -> None:
    # Room names are the map ARCHITECTURE.md and the layers contract draw: a new one goes in both.
    assert [room.name for room in ROOMS] == [
        "db",
        "grants",
        "nodes",
        "postgres",
        "queue",
        "store",
        "teams",
        "views",
    ]
    assert sorted(p.name for p in LEDGER.glob("*.py")) == ["__init__.py", "ledger.py", "shared.py"]


@pytest.mark.parametrize("room", ROOMS, ids=lambda room: room.name)
def test_a_room_says_its_job_in_one_line(room: Path) -> None:
    docstring = ast.get_docstring(ast.parse((room / "__init__.py").read_text()))
    assert docstring, f"{room.name}/__init__.py has no docstring saying the room's job"
    assert "\n" not in docstring.strip(), f"{room.name}'s docstring is more than one line"


@pytest.mark.parametrize("room", ROOMS, ids=lambda room: room.name)
def test_a_room_holds_at_most_ten_modules(room: Path) -> None:
    modules = sorted(p.name for p in room.glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= MAX_MODULES_PER_ROOM, f"{room.name} holds {len(modules)}: {modules}"


def test_no_ledger_module_is_over_400_lines() -> None:
    long = {
        str(path.relative_to(LEDGER)): n
        for path in LEDGER.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES_PER_MODULE
    }
    assert long == {}, f"split these by job: {long}"
