"""Preemption victims: who may be preempted, and the choice that loses the least work (pure)."""

from __future__ import annotations

import pytest

from airflow_gpupool.governance.preemption import (
    Preemptor,
    VictimCandidate,
    VictimOrder,
    choose_victims,
    lost_gpu_seconds,
    may_preempt,
)

NOW = 10_000.0


def grant(
    rid: str,
    *,
    priority: int = 0,
    preemptible: bool = True,
    age: float = 3600,
    milli: int = 1000,
    checkpoint_age: float | None = None,
    borrowed: bool = False,
    team: str | None = None,
    blocks_by_class: bool = False,
    on_headroom_loan: bool = False,
) -> VictimCandidate:
    checkpoint_at = None if checkpoint_age is None else NOW - checkpoint_age
    return VictimCandidate(
        rid,
        priority,
        preemptible,
        NOW - age,
        milli,
        checkpoint_at,
        borrowed,
        team,
        blocks_by_class,
        on_headroom_loan,
    )


def victims(preemptor: Preemptor, candidates: list[VictimCandidate], free: int = 0) -> list[str] | None:
    chosen = choose_victims(preemptor, candidates, free_milli=free, now=NOW, min_runtime_seconds=300)
    return None if chosen is None else [v.reservation_id for v in chosen]


def test_the_victim_losing_least_work_since_its_checkpoint_goes_first() -> None:
    fresh = grant("fresh-checkpoint", checkpoint_age=60)  # loses 60 GPU-s
    stale = grant("stale-checkpoint", checkpoint_age=1800)  # loses 1800 GPU-s
    none = grant("no-checkpoint", age=900)  # loses 900 GPU-s
    assert victims(Preemptor(priority=10, milli=1000), [stale, none, fresh]) == ["fresh-checkpoint"]
    assert victims(Preemptor(priority=10, milli=2000), [stale, none, fresh]) == [
        "fresh-checkpoint",
        "no-checkpoint",
    ]
    assert lost_gpu_seconds(grant("half", milli=500, checkpoint_age=100), NOW) == 50


def test_ties_go_to_the_lowest_priority_then_the_newest() -> None:
    same = {"checkpoint_age": 60}
    low, mid = grant("p1", priority=1, **same), grant("p2", priority=2, **same)  # type: ignore[arg-type]
    older, newer = grant("old", age=7200, **same), grant("new", age=3600, **same)  # type: ignore[arg-type]
    assert victims(Preemptor(priority=10, milli=1000), [mid, low]) == ["p1"]
    assert victims(Preemptor(priority=10, milli=1000), [older, newer]) == ["new"]


@pytest.mark.parametrize(
    ("candidate", "preemptor"),
    [
        pytest.param(grant("np", preemptible=False), Preemptor(10, 1000), id="not-preemptible"),
        pytest.param(grant("eq", priority=10), Preemptor(10, 1000), id="same-priority"),
        pytest.param(grant("young", age=100), Preemptor(10, 1000), id="within-min-runtime"),
        pytest.param(
            grant("b", priority=10, borrowed=True), Preemptor(10, 1000), id="borrowed-but-no-reclaim"
        ),
        pytest.param(
            grant("np-borrowed", priority=10, borrowed=True, preemptible=False),
            Preemptor(10, 1000, reclaims=True),
            id="borrowed-not-preemptible",
        ),
        pytest.param(grant("low"), Preemptor(10, 1000, was_preempted=True), id="no-cascade"),
    ],
)
def test_who_is_never_a_victim(candidate: VictimCandidate, preemptor: Preemptor) -> None:
    assert victims(preemptor, [candidate]) is None


def test_a_lender_reclaims_borrowed_capacity_at_equal_priority() -> None:
    borrowed = grant("borrowed", priority=10, borrowed=True, team="research")
    lender = Preemptor(priority=10, milli=1000, reclaims=True, team="data")
    assert victims(lender, [borrowed]) == ["borrowed"]


# Kueue's cohort rule: priority preempts within a team; across teams only borrowers are victims,
# of higher-priority work or of a lender reclaiming its nominal quota (any priority).
LOW, HIGH = 0, 100


@pytest.mark.parametrize(
    ("victim", "preemptor", "expected"),
    [
        pytest.param(
            grant("v", priority=LOW, team="a"), Preemptor(HIGH, 1000, team="a"), True,
            id="own-team-higher-priority-within-nominal",
        ),
        pytest.param(
            grant("v", priority=LOW, team="a", borrowed=True), Preemptor(HIGH, 1000, team="a"), True,
            id="own-team-higher-priority-borrowing",
        ),
        pytest.param(
            grant("v", priority=HIGH, team="a"), Preemptor(HIGH, 1000, reclaims=True, team="a"), False,
            id="own-team-same-priority-reclaim-is-not-across-teams",
        ),
        pytest.param(
            grant("v", priority=LOW, team="a"), Preemptor(HIGH, 1000, team="b"), False,
            id="other-team-within-nominal-higher-priority",
        ),
        pytest.param(
            grant("v", priority=LOW, team="a"), Preemptor(HIGH, 1000, reclaims=True, team="b"), False,
            id="other-team-within-nominal-reclaim",
        ),
        pytest.param(
            grant("v", priority=LOW, team="a", borrowed=True), Preemptor(HIGH, 1000, team="b"), True,
            id="other-team-borrowing-higher-priority",
        ),
        pytest.param(
            grant("v", priority=HIGH, team="a", borrowed=True),
            Preemptor(LOW, 1000, reclaims=True, team="b"),
            True,
            id="other-team-borrowing-lender-reclaims-at-lower-priority",
        ),
        pytest.param(
            grant("v", priority=HIGH, team="a", borrowed=True), Preemptor(HIGH, 1000, team="b"), False,
            id="other-team-borrowing-same-priority-no-reclaim",
        ),
        pytest.param(
            grant("v", priority=LOW, team="a", borrowed=True, preemptible=False),
            Preemptor(HIGH, 1000, reclaims=True, team="b"),
            False,
            id="other-team-borrowing-not-preemptible",
        ),
        pytest.param(
            grant("v", priority=LOW, team="a", borrowed=True, age=30),
            Preemptor(HIGH, 1000, reclaims=True, team="b"),
            False,
            id="other-team-borrowing-within-min-runtime",
        ),
        pytest.param(
            grant("v", priority=LOW, team="a", borrowed=True),
            Preemptor(HIGH, 1000, reclaims=True, was_preempted=True, team="b"),
            False,
            id="other-team-borrowing-no-cascade",
        ),
        pytest.param(
            grant("v", priority=LOW), Preemptor(HIGH, 1000), True, id="no-teams-priority-decides"
        ),
        pytest.param(
            grant("v", priority=LOW, team="a", blocks_by_class=True),
            Preemptor(HIGH, 1000, reclaims=True, team="b"),
            True,
            id="other-team-within-nominal-blocks-by-class-higher-priority-reclaim",
        ),
        pytest.param(
            grant("v", priority=LOW, team="a", blocks_by_class=True), Preemptor(HIGH, 1000, team="b"), False,
            id="other-team-within-nominal-blocks-by-class-no-reclaim",
        ),
        pytest.param(
            grant("v", priority=HIGH, team="a", blocks_by_class=True),
            Preemptor(LOW, 1000, reclaims=True, team="b"),
            False,
            id="other-team-within-nominal-blocks-by-class-lower-priority-reclaim",
        ),
    ],
)  # fmt: skip
def test_kueue_cohort_rule(victim: VictimCandidate, preemptor: Preemptor, expected: bool) -> None:
    assert may_preempt(preemptor, victim, NOW, 300) is expected
    assert (victims(preemptor, [victim]) is not None) is expected


def test_a_reclaim_takes_another_teams_grants_only_while_that_team_still_borrows() -> None:
    # Team a holds 1 GPU beyond its nominal quota in two 1-GPU grants, team c 1 GPU beyond its own:
    # a lender needing 2 GPUs takes one of a's and c's, not both of a's.
    a1 = grant("a-newest-checkpoint", team="a", borrowed=True, checkpoint_age=10)
    a2 = grant("a-fresh-checkpoint", team="a", borrowed=True, checkpoint_age=20)
    c1 = grant("c-stale-checkpoint", team="c", borrowed=True, checkpoint_age=900)
    lender = Preemptor(priority=LOW, milli=2000, reclaims=True, team="b")
    chosen = choose_victims(
        lender,
        [a1, a2, c1],
        free_milli=0,
        now=NOW,
        min_runtime_seconds=300,
        borrowing_milli={"a": 1000, "c": 1000},
    )
    assert chosen is not None and [v.reservation_id for v in chosen] == [
        "a-newest-checkpoint",
        "c-stale-checkpoint",
    ]
    # Without the teams' borrowing, each grant's flag alone decides: the least work lost.
    assert victims(lender, [a1, a2, c1]) == ["a-newest-checkpoint", "a-fresh-checkpoint"]
    # Own-team victims are not limited by borrowing.
    own = Preemptor(priority=HIGH, milli=2000, team="a")
    chosen = choose_victims(
        own, [a1, a2], free_milli=0, now=NOW, min_runtime_seconds=300, borrowing_milli={"a": 0}
    )
    assert chosen is not None and len(chosen) == 2


def test_nothing_is_preempted_when_free_capacity_suffices_or_victims_cannot() -> None:
    assert victims(Preemptor(10, 1000), [grant("low")], free=1000) == []
    assert victims(Preemptor(10, 3000), [grant("a"), grant("b")]) is None
    assert victims(Preemptor(10, 3000), [grant("a"), grant("b")], free=1000) == ["a", "b"]


def test_kueue_order_takes_borrowers_then_lowest_priority_then_newest_blind_to_checkpoints() -> None:
    fresh = grant("fresh-checkpoint", priority=1, checkpoint_age=60, age=7200)
    stale_new = grant("stale-newest", priority=1, checkpoint_age=1800, age=3600)
    low = grant("lowest-priority", priority=0, checkpoint_age=3000)
    lender = grant("borrower", priority=5, checkpoint_age=3000, borrowed=True)
    chosen = choose_victims(
        Preemptor(priority=10, milli=1000),
        [fresh, stale_new, low, lender],
        free_milli=0,
        now=NOW,
        min_runtime_seconds=300,
        order=VictimOrder.KUEUE,
    )
    assert chosen is not None and [v.reservation_id for v in chosen] == ["borrower"]
    without_borrower = [fresh, stale_new, low]
    chosen = choose_victims(
        Preemptor(priority=10, milli=2000),
        without_borrower,
        free_milli=0,
        now=NOW,
        min_runtime_seconds=300,
        order=VictimOrder.KUEUE,
    )
    assert chosen is not None and [v.reservation_id for v in chosen] == ["lowest-priority", "stale-newest"]
    # Ours picks the freshest checkpoint for the same request.
    assert victims(Preemptor(priority=10, milli=1000), without_borrower) == ["fresh-checkpoint"]


@pytest.mark.parametrize(
    ("victim", "preemptor", "expected"),
    [
        pytest.param(
            grant("v", priority=LOW, team="a", on_headroom_loan=True),
            Preemptor(HIGH, 1000, team="b", urgent=True),
            True,
            id="on-loan-within-nominal-urgent-higher-priority",
        ),
        pytest.param(
            grant("v", priority=LOW, team="a", on_headroom_loan=True),
            Preemptor(HIGH, 1000, team="b"),
            False,
            id="on-loan-within-nominal-not-urgent",
        ),
        pytest.param(
            grant("v", priority=HIGH, team="a", on_headroom_loan=True),
            Preemptor(HIGH, 1000, team="b", urgent=True),
            False,
            id="on-loan-same-priority-urgent",
        ),
        pytest.param(
            grant("v", priority=LOW, team="a", on_headroom_loan=True, preemptible=False),
            Preemptor(HIGH, 1000, team="b", urgent=True),
            False,
            id="on-loan-not-preemptible",
        ),
    ],
)
def test_urgent_work_takes_back_the_lent_headroom(
    victim: VictimCandidate, preemptor: Preemptor, expected: bool
) -> None:
    assert may_preempt(preemptor, victim, NOW, 300) is expected
