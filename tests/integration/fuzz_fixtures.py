"""Fixtures of the fuzz tests: one ledger per backend and module, the files the placeholders name.

Module-scoped: a fuzz test compares a ledger before and after each command, so the state a
previous example left is fine, and a ledger per example would cost most of the time budget.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import MetaData, create_engine
from sqlalchemy.engine import make_url

from airflow_gpupool.ledger import Ledger
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import POSTGRES_URL, node, require_postgres

__all__ = [
    "VALID_INVENTORY",
    "VALID_QUOTAS",
    "LedgerRows",
    "fuzz_paths",
    "fuzz_rows",
    "fuzz_url",
    "run_main",
]

VALID_INVENTORY = yaml.safe_dump(
    {"nodes": [{"name": "n1", "gpus": [{"model": "A100", "memory": "80Gi", "count": 2}]}]}
).encode()
VALID_QUOTAS = (
    b"headroom: {share: 0.1}\n"
    b"teams:\n"
    b"  - {name: vision, cohort: lab, quotas: [{flavor: {pool: default}, nominal: 1, borrowing_limit: 1}]}\n"
    b"  - {name: nlp, cohort: lab, quotas: [{flavor: {pool: default}, nominal: 0.5}]}\n"
)


@pytest.fixture(scope="module")
def fuzz_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The files the placeholders name: valid ones, broken ones, and what is not a file."""
    from airflow_gpupool.testing.fake_nvml import node_spec, write_spec

    root = tmp_path_factory.mktemp("fuzz")
    files = {
        "inventory": VALID_INVENTORY,
        "bad_inventory": b"nodes:\n  - name: \xff\xfe\n",
        "quota": VALID_QUOTAS,
        "bad_quota": b"teams:\n  - {name: vision, quotas: [{flavor: {pool: default}, nominal: -1}]}\n",
        "junk": b"\x00\xff\x7f{[: not yaml",
    }
    out = {"missing": str(root / "missing" / "file"), "folder": str(root)}
    for name, data in files.items():
        (root / name).write_bytes(data)
        out[name] = str(root / name)
    write_spec(root / "fake.yaml", node_spec("n1", 2))
    out["fake_spec"] = str(root / "fake.yaml")
    return out


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fuzz_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, fuzz_paths: dict[str, str]
) -> Iterator[str]:
    """A ledger of two nodes and one reservation (``held``) on each backend; no cluster reachable."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KUBECONFIG", fuzz_paths["missing"])
        env.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        if request.param == "sqlite":
            yield from _ledger(f"sqlite:///{tmp_path_factory.mktemp('ledger')}/ledger.db", fuzz_paths)
            return
        require_postgres()
        schema = f"gpupool_t_{uuid.uuid4().hex[:12]}"
        admin = create_engine(POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://", 1))
        with admin.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
        url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
        try:
            yield from _ledger(url.render_as_string(hide_password=False), fuzz_paths)
        finally:
            with admin.begin() as conn:
                conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            admin.dispose()


def _ledger(url: str, paths: dict[str, str]) -> Iterator[str]:
    ledger = Ledger.create(url)
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=1, mig={0: ["1g.10gb"] * 7})])
    ledger.reserve(GpuRequest(gpu_milli=250), "fuzz", reservation_id="held")  # for explain and release
    ledger.close()
    paths["url"] = url
    yield url


@pytest.fixture(scope="module")
def fuzz_rows(fuzz_url: str) -> Iterator[LedgerRows]:
    """The fuzzed ledger's tables, read before and after each command."""
    reader = LedgerRows(fuzz_url)
    yield reader
    reader.close()


def written(path: Path, data: bytes) -> str:
    """Write ``data`` to ``path``; return the path as text."""
    path.write_bytes(data)
    return str(path)


class LedgerRows:
    """Every row of every table of a ledger, to compare before and after a refused command."""

    def __init__(self, url: str) -> None:
        self._engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        self._tables = MetaData()
        self._tables.reflect(self._engine)

    def dump(self) -> dict[str, list[str]]:
        """Return each table's rows, as sorted text (rows have no order)."""
        with self._engine.connect() as conn:
            return {
                table.name: sorted(repr(tuple(row)) for row in conn.execute(table.select()))
                for table in self._tables.sorted_tables
            }

    def close(self) -> None:
        self._engine.dispose()


def run_main(main: Callable[[list[str]], int], args: list[str]) -> int:
    """Run ``gpupool`` in-process; return its exit code (argparse's usage error included)."""
    try:
        return int(main(args))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
