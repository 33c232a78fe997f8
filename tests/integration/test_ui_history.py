"""The page's history and use per team and pool, read from a real ledger (SQLite and PostgreSQL).

The story (times from the fake clock's start, ``T``):
    T+0      vision try 1 of train/fit asks for 1 A100 in pool ``train``: granted at once
    T+0      nlp asks for 0.5 GPU (embed/encode, mapped 3, try 2): granted on the other A100
    T+0      ops asks for a T4 (pool ``infer`` has none free after the first ask): waits
    T+1800   nlp releases (held 30 min: 0.25 GPU-hours)
    T+3600   try 1 of train/fit failed (preempted); its grant is released
    T+3600   ops, whose 3000 s timeout passed, is reaped (waited 3600 s, never granted), then the T4
             is released (held 1 h)
    T+7200   now
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_gpupool.exceptions import FailureClass, InvalidRequestError
from airflow_gpupool.governance.quotas import Flavor, QuotaPlan, TeamQuota
from airflow_gpupool.ledger import (
    GpuSample,
    HistoryFilter,
    Ledger,
    LedgerHistory,
    LedgerQuotas,
    NodeReport,
    TaskAttempt,
    TaskAttempts,
    ledger_totals,
    usage_report,
)
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.task_try import TaskTry
from tests.ledger_fixtures import FakeClock, node

TRAIN = TaskTry("train", "fit", "manual__1", -1, 1, "w1")
EMBED = TaskTry("embed", "encode", "scheduled__1", 3, 2, "w2")


@pytest.fixture
def story(ledger: Ledger, clock: FakeClock) -> Ledger:
    ledger.upsert_nodes(
        [
            node("a100-1", gpus=2, model="A100", pool="train"),
            node("t4-1", gpus=1, model="T4", memory_mib=16384, pool="infer"),
        ]
    )
    train_request = GpuRequest(gpus=1, gpu_models=frozenset({"A100"}), team="vision")
    train = ledger.reserve(train_request, TRAIN.holder, reservation_id="r-train", ttl=7200)
    ledger.reserve(
        GpuRequest(gpu_milli=500, gpu_models=frozenset({"A100"}), team="nlp"),
        EMBED.holder,
        reservation_id="r-embed",
        ttl=7200,
    )
    ledger.reserve(
        GpuRequest(gpus=1, gpu_models=frozenset({"T4"}), team="ops"),
        "notebook@laptop",
        reservation_id="r-hold-t4",
        ttl=7200,
    )
    ledger.reserve(
        GpuRequest(gpus=1, gpu_models=frozenset({"T4"}), team="ops"),
        "adhoc@laptop",
        reservation_id="r-ops",
        timeout=3000,
    )
    clock.advance(1800)
    ledger.release("r-embed")
    clock.advance(1800)
    TaskAttempts(ledger).record(
        TaskAttempt(
            TRAIN.task_key, 1, train.id, FailureClass.PREEMPTED.value, "retry", train_request, "evicted"
        )
    )
    ledger.release("r-train")
    ledger.reap()  # r-ops waited past its timeout: it ends now, before the T4 is free
    ledger.release("r-hold-t4")
    clock.advance(3600)
    return ledger


def test_history_says_requested_waited_held_try_and_failure(story: Ledger) -> None:
    entries = {e.id: e for e in LedgerHistory(story).entries()}
    train = entries["r-train"]
    assert (train.team, train.pool, train.node, train.state) == ("vision", "train", "a100-1", "released")
    assert (train.dag_id, train.task_id, train.try_number) == ("train", "fit", 1)
    assert (train.waited, train.held) == (0.0, 3600.0)
    assert train.failure_class == FailureClass.PREEMPTED.value
    assert train.outcome == "released, preempted"
    assert train.requested == GpuRequest(gpus=1, gpu_models=frozenset({"A100"})).describe()
    ops = entries["r-ops"]
    assert (ops.state, ops.granted_at, ops.held, ops.waited, ops.pool) == (
        "timed_out",
        None,
        None,
        3600.0,
        None,
    )
    embed = entries["r-embed"]
    assert (embed.map_index, embed.try_number, embed.held, embed.failure_class) == (3, 2, 1800.0, None)
    assert [e.id for e in LedgerHistory(story).entries()] == ["r-ops", "r-hold-t4", "r-embed", "r-train"]


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        pytest.param(HistoryFilter(team="nlp"), ["r-embed"], id="team"),
        pytest.param(HistoryFilter(pool="infer"), ["r-hold-t4"], id="pool"),
        pytest.param(HistoryFilter(states=("timed_out",)), ["r-ops"], id="state"),
        pytest.param(
            HistoryFilter(states=("timed_out", "released"), team="ops"), ["r-ops", "r-hold-t4"], id="two"
        ),
        pytest.param(HistoryFilter(dag_id="train"), ["r-train"], id="dag"),
        pytest.param(HistoryFilter(dag_id="trai"), [], id="dag-is-not-a-prefix-match"),
        pytest.param(HistoryFilter(dag_id="%"), [], id="dag-wildcards-are-literal"),
    ],
)
def test_history_filters(story: Ledger, where: HistoryFilter, expected: list[str]) -> None:
    history = LedgerHistory(story)
    assert [e.id for e in history.entries(where)] == expected
    assert history.count(where) == len(expected)


def test_history_pages_and_facets(story: Ledger) -> None:
    history = LedgerHistory(story)
    assert [e.id for e in history.entries(limit=2, offset=1)] == ["r-hold-t4", "r-embed"]
    assert history.facets() == {
        "team": ["nlp", "ops", "vision"],
        "pool": ["infer", "train"],
        "dag_id": ["embed", "train"],
    }


def test_an_unknown_state_is_refused_with_the_states_allowed() -> None:
    with pytest.raises(InvalidRequestError, match="state") as e:
        HistoryFilter(states=("done",))
    assert "timed_out" in str(e.value)


def test_gpu_hours_per_team_and_pool_over_a_range(story: Ledger) -> None:
    snapshot = story.snapshot()
    day = usage_report(story, snapshot, 24)
    # vision: 1 GPU × 1 h; nlp: 0.5 GPU × 0.5 h; ops: 1 T4 × 1 h.
    assert day.gpu_hours == pytest.approx(
        {("vision", "train"): 1.0, ("nlp", "train"): 0.25, ("ops", "infer"): 1.0}
    )
    assert day.by_team() == pytest.approx({"nlp": 0.25, "ops": 1.0, "vision": 1.0})
    assert day.share(day.by_team()["vision"]) == pytest.approx(1 / 2.25)
    assert day.utilization("train") == pytest.approx(1.25 / (2 * 24))
    # The last hour began when everything had ended.
    assert usage_report(story, snapshot, 1).total == 0.0
    # The last 1.5 h clip the hour-long grants to their last half hour.
    assert usage_report(story, snapshot, 1.5).by_team() == pytest.approx({"ops": 0.5, "vision": 0.5})


def test_quotas_show_nominal_held_and_borrowed(ledger: Ledger, clock: FakeClock) -> None:
    ledger.upsert_nodes([node("a100-1", gpus=4, model="A100", pool="train")])
    ledger.reserve(GpuRequest(gpus=3, team="vision"), "v@w", ttl=600)
    LedgerQuotas(ledger).apply(
        QuotaPlan(
            (
                TeamQuota("nlp", Flavor("pool", "train"), 2000, "lab"),
                TeamQuota("vision", Flavor("pool", "train"), 2000, "lab"),
            )
        )
    )
    clock.advance(1800)
    report = usage_report(ledger, ledger.snapshot(), 1)
    assert [(q.team, q.nominal, q.held, q.borrowed, q.unused) for q in report.quotas] == [
        ("nlp", 2.0, 0.0, 0.0, 2.0),
        ("vision", 2.0, 3.0, 1.0, 0.0),
    ]
    assert report.by_team() == pytest.approx({"vision": 1.5})  # 3 GPUs for the last half hour


def test_a_cohorts_borrowing_is_lent_by_its_lenders_within_their_lending_limits(
    ledger: Ledger, clock: FakeClock
) -> None:
    ledger.upsert_nodes([node("a100-1", gpus=8, model="A100", pool="train")])
    ledger.reserve(GpuRequest(gpus=3, team="vision"), "v@w", ttl=600)
    train = Flavor("pool", "train")
    LedgerQuotas(ledger).apply(
        QuotaPlan(
            (
                TeamQuota("nlp", train, 2000, "lab"),
                TeamQuota("ops", train, 2000, "lab", lending_limit_milli=500),
                TeamQuota("solo", train, 2000),  # no cohort: lends nothing
                TeamQuota("vision", train, 2000, "lab"),
            )
        )
    )
    report = usage_report(ledger, ledger.snapshot(), 1)
    # vision borrows 1 GPU; nlp may lend 2 and ops 0.5, so they lend 1 x 2/2.5 and 1 x 0.5/2.5.
    assert {q.team: q.lent for q in report.quotas} == pytest.approx(
        {"nlp": 0.8, "ops": 0.2, "solo": 0.0, "vision": 0.0}
    )
    assert [q["lent"] for q in report.to_dict()["quotas"]] == pytest.approx([0.8, 0.2, 0.0, 0.0])


def test_a_teams_gpu_use_is_what_the_agent_last_reported_for_its_gpus(
    ledger: Ledger, clock: FakeClock
) -> None:
    a100 = node("a100-1", gpus=2, model="A100", pool="train")
    ledger.upsert_nodes([a100])
    ledger.reserve(GpuRequest(gpus=1, team="vision"), "v@w", ttl=600)
    clock.advance(300)
    samples = tuple(
        GpuSample(
            index=g.index, uuid=g.uuid, bus_id=f"0000:0{g.index}:00.0", model="A100", utilization_gpu=80
        )
        for g in a100.gpus
    )
    ledger.record_report(NodeReport("a100-1", clock(), 30.0, gpus=samples))
    report = usage_report(ledger, ledger.snapshot(), 1)
    assert report.team_utilization == pytest.approx({"vision": 0.8})  # only the GPU it holds counts
    assert report.to_dict()["teams"][0]["utilization"] == pytest.approx(0.8)


def test_pruning_keeps_live_and_recent_history_and_the_counters(story: Ledger, clock: FakeClock) -> None:
    before = ledger_totals(story.url)
    history = LedgerHistory(story)
    # Everything ended 1 h (r-train, r-hold-t4, r-ops) or 1.5 h (r-embed) ago.
    assert history.prune(5400 + 1) == 0
    assert history.prune(5400 - 1) == 1  # r-embed
    story.reserve(GpuRequest(gpus=1, team="vision"), "live@w", reservation_id="r-live", ttl=86400 * 4)
    clock.advance(86400 * 3)
    assert history.prune(86400) == 3
    assert [e.id for e in history.entries()] == ["r-live"]  # live reservations are never pruned
    assert TaskAttempts(story).history(TRAIN.task_key) == []
    # What the pruned rows counted is carried over: counters never go down.
    after = ledger_totals(story.url)
    assert after.ended == before.ended
    assert after.grants == before.grants + 1
    assert after.preemptions == before.preemptions == 1
    assert after.waited_timed_out == before.waited_timed_out
    assert after.waited_granted.buckets == tuple(n + 1 for n in before.waited_granted.buckets)
    with pytest.raises(InvalidRequestError, match="retention_seconds"):
        history.prune(0)


def test_the_try_that_adopted_an_earlier_grant_finds_it(story: Ledger) -> None:
    story.reserve(GpuRequest(gpus=1, team="vision"), TRAIN.holder, reservation_id="r-try1", ttl=600)
    retry = TaskTry("train", "fit", "manual__1", -1, 2, "w9")
    story.adopt("r-try1", retry.holder)
    history = LedgerHistory(story)
    assert history.held_by(TaskTry("train", "fit", "manual__1", -1, 2)) == "r-try1"
    assert history.held_by(TaskTry("train", "fit", "manual__1", -1, 3)) is None


def test_the_controllers_pass_prunes_history_past_the_retention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes import client, config

    from airflow_gpupool.controller.leader import LeaderElector, LeaseSettings
    from airflow_gpupool.controller.run import GpuPoolController
    from airflow_gpupool.inventory.sync import core_v1_api
    from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node

    monkeypatch.setenv("AIRFLOW__GPUPOOL__HISTORY_RETENTION_DAYS", "1")
    clock = FakeClock()
    with KubernetesEmulatorServer(nodes=[gpu_node("gpu-a-0", gpus=2)]) as k8s:
        ledger = Ledger.create(f"sqlite:///{tmp_path}/ledger.db", clock=clock)
        leases = client.CoordinationV1Api(config.new_client_from_config(config_file=k8s.kubeconfig_path))
        elector = LeaderElector(leases, LeaseSettings("default", "pruner", lease_duration=60))
        with GpuPoolController(ledger, core_v1_api(k8s.kubeconfig_path), elector) as controller:
            controller.run_pass()  # syncs the node
        old = ledger.reserve(GpuRequest(gpus=1), "old@w")
        ledger.release(old.id)
        clock.advance(86400 + 1)
        recent = ledger.reserve(GpuRequest(gpus=1), "recent@w")
        ledger.release(recent.id)
        with GpuPoolController(ledger, core_v1_api(k8s.kubeconfig_path), elector) as controller:
            assert controller.run_pass().errors == []
        assert [e.id for e in LedgerHistory(ledger).entries()] == [recent.id]
        ledger.close()


def test_explain_many_says_what_explain_says_in_one_read(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("a1", gpus=1)])
    held = ledger.reserve(GpuRequest(gpus=1), "held@w")
    waiting = [ledger.reserve(GpuRequest(gpus=1), f"w{i}@w", timeout=600).id for i in range(3)]
    why = ledger.explain_many([*waiting, held.id, "nope"])
    assert why == {rid: ledger.explain(rid) for rid in [*waiting, held.id]}
    assert "reservation is granted" == why[held.id] and "needs 1 free GPU" in why[waiting[0]]
    assert ledger.explain_many([]) == {}
