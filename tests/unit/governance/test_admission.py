"""Admission by quota: within the nominal quota, borrowing in a cohort within the limits, refusals
that say why; and a property test of the quota invariants over random admissions and releases."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpupool.governance.admission import Admission, QuotaState
from airflow_gpupool.governance.quotas import Flavor, QuotaPlan, TeamQuota

A100 = Flavor("pool", "a100")
T4 = Flavor("pool", "t4")
PLAN = QuotaPlan(
    (
        TeamQuota("vision", A100, 4000, "research", borrowing_limit_milli=2000),
        TeamQuota("nlp", A100, 4000, "research", lending_limit_milli=1000),
        TeamQuota("speech", A100, 2000, "research"),
        TeamQuota("solo", A100, 1000, None),
    )
)


def state(**used: int) -> QuotaState:
    return QuotaState(PLAN, {(team, A100): milli for team, milli in used.items()})


@pytest.mark.parametrize(
    ("used", "team", "flavors", "milli", "admission", "borrowed", "reason"),
    [
        pytest.param({}, "nobody", [A100], 8000, Admission.UNGOVERNED, (), "", id="team-without-quota"),
        pytest.param({}, "vision", [T4], 8000, Admission.UNGOVERNED, (), "", id="flavor-without-quota"),
        pytest.param(
            {"vision": 3000}, "vision", [A100], 1000, Admission.WITHIN_QUOTA, (), "", id="up-to-nominal"
        ),
        pytest.param(
            {"vision": 4000},
            "vision",
            [A100, T4],
            1000,
            Admission.BORROWING,
            ((A100, 1000),),
            "",
            id="borrows",
        ),
        pytest.param(
            {"vision": 5000},
            "vision",
            [A100],
            1000,
            Admission.BORROWING,
            ((A100, 1000),),
            "",
            id="borrows-more",
        ),
        pytest.param(
            {"vision": 6000},
            "vision",
            [A100],
            1,
            Admission.REFUSED,
            (),
            "above its borrowing limit of 2",
            id="limit",
        ),
        pytest.param(
            {"solo": 1000},
            "solo",
            [A100],
            500,
            Admission.REFUSED,
            (),
            "in no cohort",
            id="no-cohort-no-borrowing",
        ),
        # With vision's quota in use, nlp lends at most 1 of its unused 4.
        pytest.param(
            {"vision": 4000, "nlp": 0, "speech": 0},
            "speech",
            [A100],
            2000,
            Admission.WITHIN_QUOTA,
            (),
            "",
            id="own",
        ),
        # With vision's quota in use, only nlp lends: at most 1 of its unused 4.
        pytest.param(
            {"vision": 4000, "speech": 2000},
            "speech",
            [A100],
            1000,
            Admission.BORROWING,
            ((A100, 1000),),
            "",
            id="cohort-lends-1",
        ),
        pytest.param(
            {"vision": 4000, "speech": 2000},
            "speech",
            [A100],
            1001,
            Admission.REFUSED,
            (),
            "lends 1",
            id="cohort-lends-no-more",
        ),
        # What vision already borrows is not lent twice.
        pytest.param(
            {"vision": 4500, "speech": 2000},
            "speech",
            [A100],
            1000,
            Admission.REFUSED,
            (),
            "lends 0.5",
            id="lent",
        ),
    ],
)
def test_admit(
    used: dict[str, int],
    team: str,
    flavors: list[Flavor],
    milli: int,
    admission: Admission,
    borrowed: tuple[tuple[Flavor, int], ...],
    reason: str,
) -> None:
    verdict = state(**used).admit(team, flavors, milli)
    assert (verdict.admission, verdict.borrowed_milli) == (admission, borrowed)
    assert reason in verdict.reason and (verdict.admitted == (admission is not Admission.REFUSED))


_teams = st.sampled_from(["vision", "nlp", "speech", "solo", "nobody"])


@settings(max_examples=300)
@given(st.lists(st.tuples(st.booleans(), _teams, st.integers(1, 3000)), max_size=40))
def test_no_team_goes_above_its_limits_and_a_lender_always_gets_its_own(
    steps: list[tuple[bool, str, int]],
) -> None:
    used: dict[tuple[str, Flavor], int] = defaultdict(int)
    quotas = {q.team: q for q in PLAN.quotas}
    for release, team, milli in steps:
        if release:
            used[(team, A100)] = max(0, used[(team, A100)] - milli)
            continue
        current = QuotaState(PLAN, dict(used))
        verdict = current.admit(team, [A100], milli)
        quota = quotas.get(team)
        if quota is not None and used[(team, A100)] + milli <= quota.nominal_milli:
            assert verdict.admission is Admission.WITHIN_QUOTA  # its nominal quota is never lent away
        if verdict.admission is Admission.BORROWING:
            assert quota is not None and quota.cohort is not None
            lendable_before = current.lendable_milli(quota.cohort, A100, besides=team)
            assert used[(team, A100)] + milli - quota.nominal_milli <= lendable_before
        if verdict.admitted:
            used[(team, A100)] += milli
        for (
            q
        ) in PLAN.quotas:  # nobody above nominal plus its borrowing limit, or plus nothing without a cohort
            ceiling = q.nominal_milli + (0 if q.cohort is None else (q.borrowing_limit_milli or 10**9))
            assert used[(q.team, A100)] <= ceiling, (q.team, dict(used))
