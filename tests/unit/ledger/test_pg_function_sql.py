"""The concurrent path's PostgreSQL functions load from their files in ``postgres/sql/``."""

from __future__ import annotations

from importlib.resources import files

import pytest

from airflow_gpupool.ledger.db.engine import ADVISORY_LOCK_KEY
from airflow_gpupool.ledger.postgres import functions

SQL = files(functions.__package__) / "sql"


@pytest.mark.parametrize("name", functions.NAMES)
def test_each_function_loads_from_its_file_with_the_lock_key_filled_in(name: str) -> None:
    ddl = functions.ddl(name)

    assert ddl.startswith(f"CREATE OR REPLACE FUNCTION {name}(") and ddl.rstrip().endswith("$$;")
    assert "__LOCK_KEY__" not in ddl
    assert f"pg_advisory_xact_lock_shared({ADVISORY_LOCK_KEY}, hashtext(current_schema()))" in ddl
    assert functions.ddl(name) is ddl  # read once


def test_every_sql_file_is_a_named_function() -> None:
    # A file no name loads would never be installed.
    assert sorted(f.name for f in SQL.iterdir() if f.name.endswith(".sql")) == sorted(
        f"{name}.sql" for name in functions.NAMES
    )


def test_an_unknown_name_says_which_there_are() -> None:
    with pytest.raises(ValueError, match=r"'gpupool_nope'.*gpupool_take, gpupool_give_back, gpupool_wait"):
        functions.ddl("gpupool_nope")
