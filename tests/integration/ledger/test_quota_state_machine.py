"""Random requests of teams with quotas, preemption, headroom loans and quota re-applies: the rules hold.

A hypothesis state machine on SQLite and PostgreSQL. Three teams share pool ``a100`` in one
cohort (with a borrowing limit and a lending limit among them), a fourth team has a quota of its
own and no cohort, a fifth has none; pool ``t4`` is governed by nobody. They reserve singles
(preemptible or not, urgent or not, some of the inference class), fractions and gangs (fixed and
elastic); they release, renew, end preempted grants as their holders would, advance the clock
through leases and preemption deadlines and reap; and the quota file is applied again, switching
between two plans (each may come first: other nominal quotas and limits; a headroom of 20 % lent
to preemptible work, or of 30 % not lent). After every step, on every governed flavor (the pool and the GPU model each
grant draws on, as :meth:`LedgerQuotas.usage` counts them):

- no team holds more than its nominal quota plus its borrowing limit (a team in no cohort: its
  nominal);
- no lender lends beyond its lending limit: what the cohort's members borrow (held above their
  nominal) is at most what its members that do not borrow could lend (the nominal of each, or its
  lending limit when lower). A member's lending floor (nominal less lending limit) is never lent;
- the headroom is held only by urgent work (priority 100, or inference) or loans
  (``headroom_loan``): the rest of a pool's grants hold at most its capacity less its headroom;
- a preemption victim is preempted for one request: once told, the request it names never changes,
  and no GPU is held past its capacity (the freed slice is granted once).

A re-applied file does not take back what was granted under the one before: a team may hold more
than the new plan allows by grants made before it, never by one made after (each bound above is
checked as ``held <= max(bound, held by grants older than the plan)``; the cohort's, which mixes
teams, only once no older grant holds in the pool). The ledger's own invariants
(:meth:`Ledger.check_invariants`) hold too. ``test_quota_state_machine_planted.py`` plants a
break of each rule in a copy of the package and sees this machine fail.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

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
headroom: {share: 0.2, lend_to_preemptible: true, urgent_priority: 100}
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
#: The second plan: other nominal quotas and limits, a larger headroom, not lent.
QUOTAS_AGAIN = """
headroom: {share: 0.3, urgent_priority: 100}
teams:
  - name: vision
    cohort: lab
    quotas:
      - {flavor: {pool: a100}, nominal: 2}
  - name: nlp
    cohort: lab
    quotas:
      - {flavor: {pool: a100}, nominal: 4, lending_limit: 0.5}
  - name: speech
    cohort: lab
    quotas:
      - {flavor: {pool: a100}, nominal: 1, borrowing_limit: 1}
  - name: ads
    quotas:
      - {flavor: {pool: a100}, nominal: 1}
"""
URGENT = 100  # the files' urgent_priority: such work may use the pools' headroom
TEAMS = ("vision", "nlp", "speech", "ads", "misc")  # misc: no quota, not governed
SHAPES = ({"gpus": 1}, {"gpu_milli": 500}, {"gpus": 2}, {"gpus": 3})
WHERE = ((), (("tier", "t4"),))  # anywhere, or on the ungoverned pool only
singles = st.builds(
    lambda shape, team, priority, preemptible, workload: GpuRequest(
        **shape, team=team, priority=priority, preemptible=preemptible, workload_class=workload
    ),
    st.sampled_from(SHAPES),
    st.sampled_from(TEAMS),
    st.sampled_from([0, 0, 1, 50, URGENT, URGENT]),
    st.booleans(),
    st.sampled_from(["training", "training", "training", "inference"]),
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


def violations(
    plan: QuotaPlan, used: dict[tuple[str, Flavor], int], older: dict[tuple[str, Flavor], int] | None = None
) -> list[str]:
    """Say which quota invariant the usage breaks, per team and cohort (empty: none).

    :param older: what grants made before ``plan`` was applied hold (they may keep more than it allows)
    """
    older = older or {}
    found = []
    by_cohort: dict[tuple[str, Flavor], list[TeamQuota]] = defaultdict(list)
    for quota in plan.quotas:
        key = (quota.team, quota.flavor)
        held = used.get(key, 0)
        ceiling = quota.nominal_milli
        if quota.cohort is not None:
            by_cohort[(quota.cohort, quota.flavor)].append(quota)
            ceiling = None if quota.borrowing_limit_milli is None else ceiling + quota.borrowing_limit_milli
        if ceiling is not None and held > max(ceiling, older.get(key, 0)):
            found.append(f"team {quota.team} holds {held}m of {quota.flavor}, above {ceiling}m")
    for (cohort, flavor), members in by_cohort.items():
        if any(older.get((q.team, flavor), 0) for q in members):
            continue  # grants of another plan hold there: what they borrowed is not this plan's
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
    """Teams under quotas that change; after each call, every rule of the module docstring holds."""

    ledger_options: ClassVar[dict[str, Any]] = {"min_runtime_seconds": 0, "preemption_grace_seconds": 30}

    def __init__(self) -> None:
        super().__init__()
        self.quotas = LedgerQuotas(self.ledger)
        self.plans = [parse_quota_file(yaml.safe_load(text)) for text in (QUOTAS, QUOTAS_AGAIN)]
        self.plan = self.plans[0]
        self.older: set[str] = set()  # grants held when a plan was applied again
        self.told: dict[str, str] = {}  # victim -> the request it was preempted for

    @initialize(which=st.sampled_from([0, 1]))
    def load_inventory_and_quotas(self, which: int) -> None:
        self.ledger.upsert_nodes(NODES)
        self.plan = self.plans[which]
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

    @rule(batch=st.lists(singles, min_size=2, max_size=5))
    def reserve_several(self, batch: list[GpuRequest]) -> None:
        """Fill the pool within one step: loans and preemption need it near full."""
        for request in batch:
            self._reserve(request, request.team, 600, 900)

    @rule(shape=st.sampled_from(SHAPES), team=st.sampled_from(TEAMS))
    def two_urgent_requests(self, shape: dict[str, Any], team: str) -> None:
        """Two preemptors at once: each victim must be told for one of them only."""
        for _ in range(2):
            self._reserve(GpuRequest(**shape, team=team, priority=URGENT), team, 600, 900)

    @rule(team=st.sampled_from(["vision", "speech"]), count=st.integers(3, 7))
    def a_team_asks_for_more(self, team: str, count: int) -> None:
        """One team asks beyond its nominal at once (urgent: only its quota binds): it borrows all it may."""
        for _ in range(count):
            self._reserve(GpuRequest(gpus=1, team=team, priority=URGENT), team, 600, 900)

    @rule(request=gangs, ttl=st.sampled_from([30, 600]), timeout=st.sampled_from([60, 900]))
    def reserve_gang(self, request: GpuRequest, ttl: int, timeout: int) -> None:
        self._reserve(request, request.team, ttl, timeout)

    @rule(which=st.sampled_from([0, 1]))
    def apply_again(self, which: int) -> None:
        self.older |= {r.id for r in self.ledger.snapshot().grants}
        self.plan = self.plans[which]
        self.quotas.apply(self.plan)

    @rule(data=st.data())
    def end_a_preempted_grant(self, data: st.DataObject) -> None:
        """Its holder saw the preemption, ended the pod and releases the grant."""
        preempting = sorted(r.id for r in self.ledger.snapshot().grants if r.preempted_by is not None)
        if preempting:
            self.ledger.release(data.draw(st.sampled_from(preempting), label="preempted"))

    def _older_grants(self) -> tuple[Reservation, ...]:
        return tuple(r for r in self.ledger.snapshot().grants if r.id in self.older)

    @invariant()
    def quotas_hold(self) -> None:
        broken = self.ledger.check_invariants()
        assert not broken, broken
        found = violations(self.plan, self.quotas.usage(), self.quotas.usage(self._older_grants()))
        assert not found, found

    @invariant()
    def headroom_holds(self) -> None:
        found = headroom_violations(self.plan, self.ledger.snapshot().grants, self._older_grants())
        assert not found, found

    @invariant()
    def a_victim_is_preempted_for_one_request(self) -> None:
        held: dict[tuple[str, int], int] = defaultdict(int)
        for reservation in self.ledger.snapshot().grants:
            grant, by = reservation.grant, reservation.preempted_by
            if by is not None:
                assert self.told.setdefault(reservation.id, by) == by, (
                    f"{reservation.id} preempted for {self.told[reservation.id]}, then for {by}"
                )
            if grant is not None and grant.mig_slice is None:
                for index in grant.gpu_indices:
                    held[(grant.node, index)] += grant.milli_per_gpu
        over = {gpu: milli for gpu, milli in held.items() if milli > 1000}
        assert not over, f"GPUs held past their capacity: {over}"


def headroom_violations(
    plan: QuotaPlan, grants: tuple[Reservation, ...], older: tuple[Reservation, ...] = ()
) -> list[str]:
    """Say which pool lets work that is neither urgent nor on loan into its headroom.

    :param older: the grants made before ``plan`` was applied (they may hold what it keeps)
    """
    capacity: dict[str, int] = defaultdict(int)
    for n in NODES:
        capacity[n.node_pool] += len(n.gpus) * 1000
    held, held_before = _not_urgent_held(grants), _not_urgent_held(older)
    found = []
    for pool, milli in sorted(held.items()):
        outside = capacity[pool] - math.ceil(plan.headroom.share(pool) * capacity[pool])
        if milli > max(outside, held_before.get(pool, 0)):
            found.append(
                f"pool {pool}: {milli}m held by work that is neither urgent nor on loan,"
                f" above {capacity[pool]}m less its headroom"
            )
    return found


def _not_urgent_held(grants: tuple[Reservation, ...]) -> dict[str, int]:
    """Return per pool the milli-GPU that grants neither urgent nor on loan hold."""
    held: dict[str, int] = defaultdict(int)
    for reservation in grants:
        request, grant = reservation.request, reservation.grant
        urgent = request.priority >= URGENT or request.workload_class.value == "inference"
        if grant is not None and not urgent and not reservation.headroom_loan:
            held[grant.node_pool] += grant_milli(grant)
    return held


def test_the_headroom_check_sees_work_neither_urgent_nor_on_loan_in_the_headroom() -> None:
    plan = parse_quota_file(yaml.safe_load(QUOTAS))
    assert plan.headroom.share("a100") == 0.2  # 2 of a100's 10 GPUs
    four = Grant("a1", "a100", (0, 1, 2, 3), ("u0", "u1", "u2", "u3"), "A100", 1000, 0, None, None, 0.0, 60.0)
    ask = GpuRequest(gpus=4, team="nlp")
    reservation = Reservation("r", "h", ReservationState.GRANTED, ask, 0.0, 1.0, four)
    half = replace(four, gpu_indices=(0,), gpu_uuids=("u0",), milli_per_gpu=500)
    assert headroom_violations(plan, (reservation, replace(reservation, id="s"))) == []
    (found,) = headroom_violations(plan, (reservation, reservation, replace(reservation, grant=half)))
    assert found == (
        "pool a100: 8500m held by work that is neither urgent nor on loan, above 10000m less its headroom"
    )
    # Within nlp's nominal or not, preemptible or not: only loans and urgent work may be there.
    urgent = replace(reservation, request=GpuRequest(gpus=4, priority=URGENT))
    inference = replace(reservation, request=GpuRequest(gpus=4, workload_class="inference"))
    loan = replace(reservation, headroom_loan=True)
    for allowed in (urgent, inference, loan):
        assert headroom_violations(plan, (reservation, reservation, allowed)) == []
    # Grants made before the plan may keep what they hold; none may be added above it.
    three = (reservation, reservation, replace(reservation, grant=half))
    assert headroom_violations(plan, three, older=three) == []
    assert headroom_violations(plan, three, older=three[:2]) != []


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
    # Under a plan applied since, a team keeps what older grants hold, and gains nothing above it.
    assert violations(plan, {("ads", a100): 2000}, {("ads", a100): 2000}) == []
    assert violations(plan, {("ads", a100): 2500}, {("ads", a100): 2000}) != []
    assert violations(plan, {("vision", a100): 5000, ("speech", a100): 2000}, {("speech", a100): 500}) == []


@pytest.mark.parametrize(
    ("backend", "examples"),
    [
        pytest.param("sqlite", 40, id="sqlite"),
        pytest.param("postgresql", 20, id="postgresql", marks=pytest.mark.postgres),
    ],
)
def test_the_quota_rules_hold_through_preemption_loans_and_reapplies(
    backend: str, examples: int, tmp_path: Path
) -> None:
    run_ledger_machine(QuotaMachine, backend, tmp_path, examples=examples, steps=30)
