"""Binding-aware placement: a request goes only to a node pool whose binding can express it.

Through the ledger on SQLite and PostgreSQL, as the hook opens it (its connection's bindings).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_gpupool.exceptions import ConfigurationError, NoCapacityError
from airflow_gpupool.hooks import GpuPoolHook
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node

GRANTED = ReservationState.GRANTED
FRACTION = GpuRequest(gpu_milli=250)


def _pools(make_ledger: Callable[..., Ledger], **options: object) -> Ledger:
    ledger = make_ledger(binding="whole", node_pool_bindings={"t4-shared": "hami"}, **options)
    ledger.upsert_nodes(
        [
            node("a100-1", gpus=4, model="A100", pool="a100"),
            node("t4-1", gpus=1, model="T4", memory_mib=15360, pool="t4-shared"),
        ]
    )
    return ledger


def test_a_fraction_goes_only_where_the_binding_expresses_it(make_ledger: Callable[..., Ledger]) -> None:
    ledger = _pools(make_ledger)

    granted = [ledger.reserve(FRACTION, f"h{i}") for i in range(4)]

    assert {r.grant.node for r in granted if r.grant} == {"t4-1"}
    assert all(r.state is GRANTED for r in granted)
    # Whole GPUs may go to either pool: the a100 pool's binding expresses them.
    whole = ledger.reserve(GpuRequest(gpus=2), "w")
    assert whole.state is GRANTED and whole.grant is not None and whole.grant.node == "a100-1"
    assert ledger.check_invariants() == []


def test_a_waiting_fraction_names_the_binding_and_the_pools_that_could_take_it(
    make_ledger: Callable[..., Ledger], clock
) -> None:
    ledger = _pools(make_ledger)
    first = [ledger.reserve(FRACTION, f"h{i}") for i in range(4)]

    waiting = ledger.reserve(FRACTION, "late", timeout=60)

    assert waiting.state is ReservationState.WAITING  # the idle A100s cannot take it
    why = ledger.explain(waiting.id)
    assert "a100-1: binding 'whole' on pool a100 cannot express a fraction" in why
    assert "t4-1: needs 250 milli-GPU on one GPU, the freest GPU has 0" in why
    assert "only pools t4-shared have a binding that can express a fraction" in why
    # The closest node is the one of the right pool, not the idle one of the wrong pool.
    assert why.index("t4-1:") < why.index("a100-1:")

    ledger.release(first[0].id)
    assert ledger.get(waiting.id).state is GRANTED
    assert ledger.get(waiting.id).grant.node == "t4-1"  # type: ignore[union-attr]


def test_a_timed_out_fraction_names_the_pools(make_ledger: Callable[..., Ledger], clock) -> None:
    ledger = _pools(make_ledger)
    for i in range(4):
        ledger.reserve(FRACTION, f"h{i}")
    waiting = ledger.reserve(FRACTION, "late", timeout=60)
    clock.advance(61)

    assert ledger.reap().timed_out == (waiting.id,)

    message = ledger.get(waiting.id).message or ""
    assert "binding 'whole' on pool a100 cannot express a fraction" in message
    assert "only pools t4-shared" in message


def test_the_readme_example_on_a_whole_pool_is_refused_at_once(make_ledger: Callable[..., Ledger]) -> None:
    ledger = _pools(make_ledger)
    request = GpuRequest(gpu_milli=250, gpu_models=frozenset({"A100", "H100"}))

    with pytest.raises(NoCapacityError, match="binding 'whole' on pool a100 cannot express a fraction"):
        ledger.reserve(request, "readme")

    assert ledger.snapshot().queue == ()  # never queued: the ledger is unchanged


def test_a_mig_request_skips_a_pool_whose_binding_has_no_mig(make_ledger: Callable[..., Ledger]) -> None:
    ledger = make_ledger(binding="mig", node_pool_bindings={"shared": "hami"})
    mig = {0: ["1g.10gb", "1g.10gb"]}
    ledger.upsert_nodes([node("h1", gpus=1, mig=mig, pool="shared"), node("m1", gpus=1, mig=mig, pool="mig")])

    got = [ledger.reserve(GpuRequest(mig_profile="1g.10gb"), f"m{i}") for i in range(2)]
    third = ledger.reserve(GpuRequest(mig_profile="1g.10gb"), "m3")

    assert [r.grant.node for r in got if r.grant] == ["m1", "m1"]
    assert third.state is ReservationState.WAITING
    assert "binding 'hami' on pool shared cannot express a MIG slice" in ledger.explain(third.id)


def test_without_bindings_any_pool_takes_any_request(make_ledger: Callable[..., Ledger]) -> None:
    ledger = make_ledger()
    ledger.upsert_nodes([node("a100-1", gpus=1, pool="a100")])

    assert ledger.reserve(FRACTION, "h").state is GRANTED


def test_an_unknown_binding_is_refused_when_the_ledger_opens(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="node pool a100: unknown binding 'wholes'"):
        Ledger(f"sqlite:///{tmp_path}/l.db", node_pool_bindings={"a100": "wholes"})


def test_the_hook_places_with_its_connections_bindings(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger.create(url) as setup:
        setup.upsert_nodes([node("a100-1", gpus=1, pool="a100"), node("t4-1", gpus=1, model="T4", pool="t4")])
    hook = GpuPoolHook(None, ledger_url=url, binding="whole", node_pool_bindings="t4=hami")

    granted = [hook.reserve(FRACTION, f"h{i}", reservation_id=f"r{i}") for i in range(5)]

    assert [r.grant.node for r in granted[:4] if r.grant] == ["t4-1"] * 4
    assert granted[4].state is ReservationState.WAITING
    assert "binding 'whole' on pool a100 cannot express a fraction" in hook.explain("r4")
    hook.close()
