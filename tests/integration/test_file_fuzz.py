"""Fuzz: inventory and quota files, as bytes, are taken or refused with the project's typed error.

Bytes, not text: arbitrary binary and mutations of a valid file (bytes cut, inserted, replaced,
repeated; the file cut short). The parser answers nodes or a plan, or
:class:`InvalidInventoryError` / :class:`QuotaFileError`; never a YAML, Unicode or Python error.
The same file through ``gpupool inventory load`` / ``gpupool quota apply`` on SQLite and
PostgreSQL: no traceback, exit 0 or 2, and a refusal leaves every row of every table as it was.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_gpupool.cli import main
from airflow_gpupool.cli.quota import load_quota_file
from airflow_gpupool.exceptions import InvalidInventoryError, QuotaFileError
from airflow_gpupool.inventory import load_inventory
from tests.integration.fuzz_fixtures import VALID_INVENTORY, VALID_QUOTAS, LedgerRows, run_main

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
#: Bytes a YAML parser or a UTF-8 decoder trips on, and ones that change a number or a key.
TRICKY = st.sampled_from(
    [
        b"\xff",
        b"\xfe\xff",
        b"\x00",
        b"\xc3",
        b"\xed\xa0\x80",
        b"&a",
        b"*a",
        b"!!python/object:x",
        b"{",
        b"]",
        b"-",
        b"9" * 30,
    ]
)


@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    """Return ``valid`` after one to three edits."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        edit = draw(st.sampled_from(["cut", "insert", "replace", "repeat", "truncate"]))
        chunk = draw(TRICKY | st.binary(min_size=1, max_size=4))
        size = draw(st.integers(1, 8))
        if edit == "cut":
            del data[at : at + size]
        elif edit == "insert":
            data[at:at] = chunk
        elif edit == "replace":
            data[at : at + len(chunk)] = chunk
        elif edit == "repeat":
            data[at:at] = data[at : at + size] * 3
        else:
            del data[at:]
    return bytes(data)


def file_bytes(valid: bytes) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=64) | mutated(valid)


def _refused_unchanged(args: list[str], rows: LedgerRows, capsys: pytest.CaptureFixture[str]) -> int:
    before = rows.dump()
    code = run_main(main, args)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, args
    assert code in (0, 2), (args, code, err)
    if code == 2:
        assert err.strip()
        assert rows.dump() == before, f"{args} was refused but changed the ledger"
    return code


@FUZZ
@given(data=file_bytes(VALID_INVENTORY))
def test_an_inventory_file_is_loaded_or_refused_typed(
    data: bytes,
    fuzz_url: str,
    fuzz_rows: LedgerRows,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_bytes(data)
    try:
        nodes = load_inventory(path)
    except InvalidInventoryError as e:
        assert e.field and e.expected
        nodes = None
    code = _refused_unchanged(["inventory", "load", str(path), f"--url={fuzz_url}"], fuzz_rows, capsys)
    if nodes is None:
        assert code == 2, f"{data!r}: the parser refuses it, the command took it"


@FUZZ
@given(data=file_bytes(VALID_QUOTAS))
def test_a_quota_file_is_applied_or_refused_typed(
    data: bytes,
    fuzz_url: str,
    fuzz_rows: LedgerRows,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "quotas.yaml"
    path.write_bytes(data)
    try:
        load_quota_file(str(path))
        parsed = True
    except QuotaFileError as e:
        assert e.field and e.expected
        parsed = False
    code = _refused_unchanged(["quota", "apply", str(path), f"--url={fuzz_url}"], fuzz_rows, capsys)
    if not parsed:
        assert code == 2, f"{data!r}: the parser refuses it, the command took it"


def test_the_valid_files_are_taken(fuzz_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The files the mutations start from are valid: a refusal of a mutation is the mutation's doing."""
    for name, data, command in (
        ("inventory.yaml", VALID_INVENTORY, "inventory load"),
        ("quotas.yaml", VALID_QUOTAS, "quota apply"),
    ):
        path = tmp_path / name
        path.write_bytes(data)
        assert run_main(main, [*command.split(), str(path), f"--url={fuzz_url}"]) == 0, (
            capsys.readouterr().err
        )
