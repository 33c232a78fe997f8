"""Random requests of teams with quotas, releases, renewals and lease expiry: the quota invariants hold.

A hypothesis state machine on SQLite and PostgreSQL. Three teams share pool ``a100`` in one
cohort (one with a borrowing limit, one with a lending limit), a fourth team has a quota of its
own and no cohort, a fifth has none; pool ``t4`` is governed by nobody. They reserve singles,
fractions and gangs (fixed and elastic), release, renew, advance the clock and reap. After every
step, on every governed flavor (the pool and the GPU model each grant draws on, as
:meth:`LedgerQuotas.usage` counts them):

- no team holds more than its nominal quota plus its borrowing limit (a team in no cohort: its
  nominal);
- no lender lends beyond its lending limit: what the cohort's members borrow (held above their
  nominal) is at most what its members that do not borrow could lend (the nominal of each, or its
  lending limit when lower). A member's lending floor (nominal less lending limit) is never lent.

The file keeps the default headroom (20 % of each pool) and some requests are urgent (priority
100): work that is not urgent holds more of a pool than its capacity less the headroom only by
non-preemptible grants that kept their team within its nominal quota (each team's share of the
excess is at most its nominal in the pool, and at most what its non-preemptible, non-urgent
grants hold there: both bounds survive every release and admission the rule allows).

Quotas do not move while the machine runs and nothing preempts, so a state the admission rule
allowed stays allowed: a violation is a grant the ledger should have refused. The ledger's own
invariants (:meth:`Ledger.check_invariants`) hold too.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    rule,
)

from airflow_gpupool.governance.quotas import Flavor, QuotaPlan, TeamQuota, parse_quota_file
from airflow_gpupool.ledger import Grant, LedgerQuotas, Reservation, ReservationState, grant_milli
from airflow_gpupool.resources import GangSpec, GpuRequest
from tests.integration.ledger.test_ledger_properties import ReservingMachine, run_ledger_machine
from tests.ledger_fixtures import node

NODES = (
    node("a1", gpus=4, pool="a100"),
    node("a2", gpus=4, pool="a100"),
    node("a3", gpus=2, pool="a100"),
    node("t1", gpus=4, pool="t4", labels={"tier": "t4"}),
)
QUOTAS = """
teams:
  - name: vision
    cohort: lab
    quotas:
      - {flavor: {pool: a100}, nominal: 3, borrowing_limit: 2}
  - name: nlp
    cohort: lab
    quotas:
      - {flavor: {pool: a100}, nominal: 4, lending_limit: 1}
  - name: speech
    cohort: lab
    quotas:
      - {flavor: {pool: a100}, nominal: 1.5}
  - name: ads
    quotas:
      - {flavor: {pool: a100}, nominal: 1}
"""
URGENT = 100  # [gpupool] urgent_priority's default: such work may use the pools' headroom
TEAMS = ("vision", "nlp", "speech", "ads", "misc")  # misc: no quota, not governed
SHAPES = ({"gpus": 1}, {"gpu_milli": 500}, {"gpus": 2}, {"gpus": 3})
WHERE = ((), (("tier", "t4"),))  # anywhere, or on the ungoverned pool only
singles = st.builds(
    lambda shape, team, priority: GpuRequest(**shape, team=team, priority=priority),
    st.sampled_from(SHAPES),
    st.sampled_from(TEAMS),
    st.sampled_from([0, 0, 1, URGENT]),
)
gangs = st.builds(
    lambda shape, team, size, minimum: GpuRequest(
        **shape, team=team, gang=GangSpec(size, min(minimum, size))
    ),
    st.sampled_from(SHAPES[:2]),
    st.sampled_from(TEAMS),
    st.integers(2, 3),
    st.integers(1, 3),
)


def violations(plan: QuotaPlan, used: dict[tuple[str, Flavor], int]) -> list[str]:
    """Say which quota invariant the usage breaks, per team and cohort (empty: none)."""
    found = []
    by_cohort: dict[tuple[str, Flavor], list[TeamQuota]] = defaultdict(list)
    for quota in plan.quotas:
        held = used.get((quota.team, quota.flavor), 0)
        ceiling = quota.nominal_milli
        if quota.cohort is not None:
            by_cohort[(quota.cohort, quota.flavor)].append(quota)
            ceiling = None if quota.borrowing_limit_milli is None else ceiling + quota.borrowing_limit_milli
        if ceiling is not None and held > ceiling:
            found.append(f"team {quota.team} holds {held}m of {quota.flavor}, above {ceiling}m")
    for (cohort, flavor), members in by_cohort.items():
        borrowed = {q.team: max(0, used.get((q.team, flavor), 0) - q.nominal_milli) for q in members}
        lendable = sum(
            q.nominal_milli if q.lending_limit_milli is None else min(q.nominal_milli, q.lending_limit_milli)
            for q in members
            if not borrowed[q.team]
        )
        if sum(borrowed.values()) > lendable:
            found.append(
                f"cohort {cohort} borrows {borrowed} of {flavor}; its lenders lend {lendable}m at most"
            )
    return found


class QuotaMachine(ReservingMachine):
    """Teams under quotas; after each call, no team above its ceiling and no lender past its limit."""

    def __init__(self) -> None:
        super().__init__()
        self.quotas = LedgerQuotas(self.ledger)
        self.plan = parse_quota_file(yaml.safe_load(QUOTAS))

    @initialize()
    def load_inventory_and_quotas(self) -> None:
        self.ledger.upsert_nodes(NODES)
        self.quotas.apply(self.plan)

    @rule(
        request=singles,
        where=st.sampled_from(WHERE),
        ttl=st.sampled_from([30, 600]),
        timeout=st.sampled_from([60, 900]),
    )
    def reserve_single(
        self, request: GpuRequest, where: tuple[tuple[str, str], ...], ttl: int, timeout: int
    ) -> None:
        self._reserve(replace(request, node_labels=where), request.team, ttl, timeout)

    @rule(request=gangs, ttl=st.sampled_from([30, 600]), timeout=st.sampled_from([60, 900]))
    def reserve_gang(self, request: GpuRequest, ttl: int, timeout: int) -> None:
        self._reserve(request, request.team, ttl, timeout)

    @invariant()
    def quotas_hold(self) -> None:
        assert self.ledger.check_invariants() == []
        assert violations(self.plan, self.quotas.usage()) == []

    @invariant()
    def headroom_holds(self) -> None:
        assert headroom_violations(self.quotas.list(), self.ledger.snapshot().grants) == []


def headroom_violations(plan: QuotaPlan, grants: tuple[Reservation, ...]) -> list[str]:
    """Say which pool lets work that is not urgent into its headroom beyond what the rule allows.

    Allowed there: loans (``headroom_loan``), and per team at most min(its nominal quota in the
    pool, what its non-preemptible, non-urgent grants hold in it).
    """
    capacity: dict[str, int] = defaultdict(int)
    for n in NODES:
        capacity[n.node_pool] += len(n.gpus) * 1000
    held: dict[str, int] = defaultdict(int)
    steady: dict[tuple[str, str], int] = defaultdict(int)  # (pool, team): non-preemptible milli
    for reservation in grants:
        request, grant = reservation.request, reservation.grant
        urgent = request.priority >= URGENT or request.workload_class.value == "inference"
        if grant is not None and not urgent and not reservation.headroom_loan:
            held[grant.node_pool] += grant_milli(grant)
            if not request.preemptible:
                steady[(grant.node_pool, request.team)] += grant_milli(grant)
    nominal = {(q.flavor.name, q.team): q.nominal_milli for q in plan.quotas if q.flavor.kind == "pool"}
    allowed = {
        pool: sum(min(milli, nominal.get((p, team), 0)) for (p, team), milli in steady.items() if p == pool)
        for pool in held
    }
    return [
        f"pool {pool}: {milli}m held by work that is not urgent, above {capacity[pool]}m less its headroom"
        f" and {allowed[pool]}m of non-preemptible work within its team's nominal"
        for pool, milli in sorted(held.items())
        if milli > capacity[pool] - math.ceil(plan.headroom.share(pool) * capacity[pool]) + allowed[pool]
    ]


def test_the_headroom_check_sees_work_that_is_not_urgent_in_the_headroom() -> None:
    plan = parse_quota_file(yaml.safe_load(QUOTAS))
    assert plan.headroom.share("a100") == 0.2  # the default: 2 of a100's 10 GPUs
    four = Grant("a1", "a100", (0, 1, 2, 3), ("u0", "u1", "u2", "u3"), "A100", 1000, 0, None, None, 0.0, 60.0)
    ask = GpuRequest(gpus=4, preemptible=True)
    reservation = Reservation("r", "h", ReservationState.GRANTED, ask, 0.0, 1.0, four)
    assert headroom_violations(plan, (reservation, replace(reservation, id="s"))) == []
    assert headroom_violations(plan, (reservation,) * 3) == [
        "pool a100: 12000m held by work that is not urgent, above 10000m less its headroom"
        " and 0m of non-preemptible work within its team's nominal"
    ]
    assert headroom_violations(plan, (replace(reservation, headroom_loan=True),) * 3) == []
    # Non-preemptible work of team nlp (nominal 4) may hold 4 GPUs of the excess, not 4.5.
    nlp = replace(reservation, request=GpuRequest(gpus=4, team="nlp"))
    half = replace(four, gpu_indices=(0,), gpu_uuids=("u0",), milli_per_gpu=500)
    assert headroom_violations(plan, (reservation, reservation, nlp)) == []
    (found,) = headroom_violations(plan, (reservation, reservation, nlp, replace(nlp, grant=half)))
    assert found.endswith(
        "above 10000m less its headroom and 4000m of non-preemptible work within its team's nominal"
    )
    # Preemptible work within its nominal is not let in: it counts in the excess, not in the allowance.
    assert headroom_violations(plan, (reservation, reservation, replace(nlp, request=ask))) != []


def test_the_checks_see_a_team_above_its_ceiling_and_a_cohort_lending_past_its_limits() -> None:
    plan = parse_quota_file(yaml.safe_load(QUOTAS))
    a100 = next(q.flavor for q in plan.quotas)
    assert (
        violations(plan, {("vision", a100): 5000, ("nlp", a100): 1000}) == []
    )  # 2 borrowed of nlp's 1 + speech's 1.5
    assert violations(plan, {("vision", a100): 5500}) == ["team vision holds 5500m of pool:a100, above 5000m"]
    assert violations(plan, {("ads", a100): 1500}) == ["team ads holds 1500m of pool:a100, above 1000m"]
    # vision borrows 2 and speech 0.5: only nlp lends, 1 at most (its floor of 3 stays its own).
    (found,) = violations(plan, {("vision", a100): 5000, ("speech", a100): 2000})
    assert found.startswith("cohort lab borrows") and found.endswith("its lenders lend 1000m at most")


@pytest.mark.parametrize(
    ("backend", "examples"),
    [
        pytest.param("sqlite", 50, id="sqlite"),
        pytest.param("postgresql", 20, id="postgresql", marks=pytest.mark.postgres),
    ],
)
def test_no_team_exceeds_its_quota_and_no_lender_lends_past_its_limit(
    backend: str, examples: int, tmp_path: Path
) -> None:
    run_ledger_machine(QuotaMachine, backend, tmp_path, examples=examples, steps=30)
