"""Ledger fixtures shared by unit and integration tests: real SQLite and PostgreSQL ledgers.

Each PostgreSQL test gets a schema of its own in the database at ``GPUPOOL_TEST_POSTGRES_URL``
(default ``postgresql://postgres@127.0.0.1:5432/test``), dropped afterwards. Without a
reachable server the PostgreSQL cases skip with the reason, except under ``CI=true``, where
they fail: CI must run them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, event
from sqlalchemy.engine import make_url

from airflow_gpupool.ledger import Ledger
from airflow_gpupool.resources import GpuDevice, MigSlice, NodeInventory
from tests.skips import skip_or_fail

POSTGRES_URL = os.environ.get("GPUPOOL_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


class FakeClock:
    """A clock tests move by hand, so leases and timeouts expire without sleeping."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def postgres_available() -> str | None:
    """Return None when PostgreSQL answers, else why not."""
    try:
        engine = create_engine(POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://", 1))
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        engine.dispose()
        return None
    except Exception as e:  # any failure to connect means "not available here"
        return f"PostgreSQL at {POSTGRES_URL} is not reachable ({type(e).__name__}); set GPUPOOL_TEST_POSTGRES_URL"


def require_postgres() -> None:
    """Skip (or, under CI=true, fail) when PostgreSQL is not reachable."""
    reason = postgres_available()
    if reason is not None:
        skip_or_fail(reason, what="the PostgreSQL tests")


@pytest.fixture
def pg_schema_url() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh schema, dropped after the test."""
    require_postgres()
    name = f"gpupool_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://", 1))
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {name}")
    url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={name}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: object) -> str:
    """A URL of a fresh, empty database of each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.db"
    return str(request.getfixturevalue("pg_schema_url"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_ledger(ledger_url: str, clock: FakeClock) -> Iterator[Callable[..., Ledger]]:
    """Open ledgers on the test's database (a fake clock and best-fit unless told otherwise)."""
    opened: list[Ledger] = []

    def make(**options: object) -> Ledger:
        options.setdefault("clock", clock)
        options.setdefault("policy", "bestfit")
        ledger = Ledger.create(ledger_url, **options)  # type: ignore[arg-type]
        opened.append(ledger)
        return ledger

    yield make
    for ledger in opened:
        ledger.close()


@pytest.fixture
def ledger(make_ledger: Callable[..., Ledger]) -> Ledger:
    return make_ledger()


def node(
    name: str,
    gpus: int = 0,
    model: str = "A100",
    memory_mib: int = 81920,
    cpu: int = 64000,
    mem: int = 262144,
    mig: dict[int, list[str]] | None = None,
    labels: dict[str, str] | None = None,
    pool: str = "default",
) -> NodeInventory:
    """Build a node: ``node("n1", gpus=8, model="A100", mig={0: ["3g.40gb", "3g.40gb"]})``."""
    mig = mig or {}
    devices = tuple(
        GpuDevice(
            i,
            f"GPU-{name}-{i}",
            model,
            memory_mib,
            tuple(MigSlice(f"{name}-g{i}-m{k}", p) for k, p in enumerate(mig.get(i, []))),
        )
        for i in range(gpus)
    )
    return NodeInventory(name, cpu, mem, devices, labels or {}, pool)  # type: ignore[arg-type]


@contextmanager
def ledger_statements(ledger: Ledger, matches: Callable[[str], bool]) -> Iterator[list[str]]:
    """Collect the SQL statements of ``ledger``'s serialized engine for which ``matches`` says yes."""
    seen: list[str] = []

    def listen(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if matches(statement):
            seen.append(statement)

    engine = ledger._store.engine  # what the serialized path and the reads run on
    event.listen(engine, "before_cursor_execute", listen)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", listen)
