"""Incremental queue service grants what a full pass grants: random queues, inventories and changes.

Two real SQLite ledgers replay the same random operations (gangs among them): one serves the queue
incrementally (the default), one tries every waiting request on every pass. After every
operation both must hold exactly the same reservations in the same states, on the same
nodes, GPUs and slices. The incremental side is driven through two ledger objects (two
processes, each with its own memory of the last pass), so changes made by the other one
must be seen too.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_gpupool.exceptions import GpuPoolError
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.resources import GangSpec, GpuRequest, WorkloadClass
from tests.ledger_fixtures import FakeClock, node

_GANGS = st.builds(lambda size, least: GangSpec(size, min(size, least)), st.integers(2, 3), st.integers(1, 3))
_REQUESTS = st.builds(
    lambda gpus, milli, cls, priority, cpu, gang: GpuRequest(
        gpus=gpus if milli is None else 0,
        gpu_milli=milli,
        workload_class=cls,
        priority=priority,
        cpu_milli=cpu,
        gang=gang,
    ),
    gpus=st.integers(0, 2),
    milli=st.none() | st.sampled_from([250, 500, 750]),
    cls=st.sampled_from(list(WorkloadClass)),
    priority=st.integers(0, 2),
    cpu=st.sampled_from([1000, 8000, 24000]),
    # Gangs too (and their elastic growth): one entry each, placed whole or not at all.
    gang=st.none() | st.none() | st.none() | _GANGS,
)
_RESERVE = st.tuples(st.just("reserve"), _REQUESTS, st.sampled_from([30.0, 300.0]), st.booleans())
_OPS = st.lists(
    st.one_of(
        _RESERVE,
        _RESERVE,
        _RESERVE,
        st.tuples(st.just("release"), st.integers(0, 5), st.booleans()),
        st.tuples(st.just("release"), st.integers(0, 5), st.booleans()),
        # Copies of the last request: a queue of one shape, of which a pass reads only what may fit.
        st.tuples(st.just("again"), st.integers(2, 6), st.booleans()),
        st.tuples(st.just("advance"), st.sampled_from([10.0, 40.0, 400.0])),
        st.tuples(st.just("health"), st.integers(0, 3), st.sampled_from(["healthy", "cordoned"])),
    ),
    min_size=10,
    max_size=60,
)
_NODES = st.lists(st.tuples(st.integers(1, 2), st.sampled_from(["A100", "T4"])), min_size=1, max_size=3)


def _state(ledger: Ledger) -> list[tuple[Any, ...]]:
    out = []
    for r in ledger.history(limit=1000):
        grant = r.grant
        where = (grant.node, grant.gpu_indices, grant.milli_per_gpu, grant.mig_slice) if grant else None
        out.append((r.id, r.state.value, where))
    return sorted(out)


def _apply(ledger: Ledger, op: tuple[Any, ...], ids: list[str], clock: FakeClock, step: int) -> str:
    kind = op[0]
    try:
        if kind == "reserve":
            rid = f"r{step}"
            ledger.reserve(op[1], f"holder-{step}", ttl=120.0, timeout=op[2], reservation_id=rid)
            ids.append(rid)
        elif kind == "again" and ids:
            last = ledger.get(ids[-1])
            for copy in range(op[1]):
                rid = f"r{step}-{copy}"
                ledger.reserve(last.request, f"holder-{step}", ttl=120.0, timeout=300.0, reservation_id=rid)
                ids.append(rid)
        elif kind == "release" and ids:
            ledger.release(ids[-1 - op[1] % len(ids)])
        elif kind == "advance":
            ledger.reap()
        elif kind == "health":
            names = [n.name for n in ledger.snapshot().nodes]
            ledger.set_health(names[op[1] % len(names)], op[2])
    except GpuPoolError as e:
        return type(e).__name__
    return "ok"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=_NODES, ops=_OPS, max_overtakes=st.integers(1, 3), policy=st.sampled_from(["bestfit", "gpupool"])
)
def test_incremental_service_grants_what_a_full_pass_grants(
    nodes: list[tuple[int, str]], ops: list[tuple[Any, ...]], max_overtakes: int, policy: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        clock = FakeClock()
        inventory = [
            node(f"n{i}", gpus=gpus, model=model, cpu=32000) for i, (gpus, model) in enumerate(nodes)
        ]
        options: dict[str, Any] = {"clock": clock, "policy": policy, "max_overtakes": max_overtakes}
        full = Ledger.create(f"sqlite:///{Path(tmp) / 'full.db'}", incremental_service=False, **options)
        incremental = Ledger.create(f"sqlite:///{Path(tmp) / 'inc.db'}", **options)
        other = Ledger(incremental.url, **options)  # another process on the incremental ledger
        try:
            for ledger in (full, incremental):
                ledger.upsert_nodes(inventory)
            ids_full: list[str] = []
            ids_inc: list[str] = []
            for step, op in enumerate(ops):
                if op[0] == "advance":
                    clock.advance(op[1])
                side = other if op[-1] is True and op[0] in ("reserve", "release") else incremental
                expected = _apply(full, op, ids_full, clock, step)
                got = _apply(side, op, ids_inc, clock, step)
                assert got == expected, f"step {step} {op}: {got} != {expected}"
                assert _state(incremental) == _state(full), f"after step {step}: {op}"
        finally:
            for ledger in (full, incremental, other):
                ledger.close()


def test_a_release_skips_the_requests_that_cannot_fit_what_was_freed(tmp_path: Path) -> None:
    # The saving the property test does not see: blocked requests are not placed again.
    ledger = Ledger.create(f"sqlite:///{tmp_path / 'l.db'}", policy="bestfit")
    ledger.upsert_nodes([node("big", gpus=8), node("small", gpus=1)])
    whole = ledger.reserve(GpuRequest(gpus=8), "whole")
    small = ledger.reserve(GpuRequest(gpus=1), "small")
    for i in range(20):
        ledger.reserve(GpuRequest(gpus=8), f"wait-{i}")
    placed: list[str] = []
    real_place = ledger._cycle.place

    def counting(nodes: Any, request: GpuRequest, *args: Any) -> Any:
        placed.append(request.describe())
        return real_place(nodes, request, *args)

    ledger._cycle.place = counting  # type: ignore[method-assign]
    ledger.release(small.id)  # one GPU freed on "small": no 8-GPU request can fit it
    assert placed == []
    ledger.release(whole.id)  # "big" is empty: the first waiter is placed, the other shapes are known
    assert len(placed) == 1
    assert ledger.snapshot().grants[0].holder == "wait-0"
