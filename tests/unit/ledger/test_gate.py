"""The queue gate's rule, pure: what a pass publishes and what it lets a grant or a release skip."""

from __future__ import annotations

import pytest

from airflow_gpupool.ledger.store.gate import ALL_SPENT, NO_WAITER, QueueGate
from airflow_gpupool.placement.snapshot import GpuState, NodeState
from airflow_gpupool.resources import GangSpec, GpuRequest


def node(*free_milli: int, partitioned: tuple[int, ...] = ()) -> NodeState:
    gpus = tuple(
        GpuState(i, "A100", 81920, free, partitioned=i in partitioned) for i, free in enumerate(free_milli)
    )
    return NodeState("n1", 64000, 262144, gpus)


def test_a_pass_publishes_the_smallest_shapes_and_the_highest_unspent_priority() -> None:
    waiting = [GpuRequest(gpus=8), GpuRequest(gpus=2), GpuRequest(gpu_milli=600), GpuRequest(gpu_milli=300)]
    gate = QueueGate.after_pass(waiting, [0, 5], may_skip=True)
    assert gate == QueueGate(True, 2, 300, 5, 0)
    assert QueueGate.after_pass(waiting, [0, 5], may_skip=True, bound=8).bound == 8
    assert QueueGate.after_pass([], [], may_skip=True) == QueueGate(True, NO_WAITER, NO_WAITER, ALL_SPENT, 0)
    assert QueueGate.from_meta(gate.to_meta()) == gate


@pytest.mark.parametrize(
    "waiting",
    [
        pytest.param(GpuRequest(gpus=1, gang=GangSpec(2, 2)), id="a gang"),
        pytest.param(GpuRequest(mig_profile="1g.10gb"), id="a MIG slice"),
        pytest.param(GpuRequest(gpus=0, cpu_milli=500), id="CPU only"),
    ],
)
def test_what_a_gate_cannot_summarize_closes_it(waiting: GpuRequest) -> None:
    assert QueueGate.after_pass([GpuRequest(gpus=1), waiting], [], may_skip=True) == QueueGate()


def test_a_closed_or_missing_gate_lets_nothing_pass() -> None:
    closed = QueueGate.after_pass([GpuRequest(gpus=1)], [], may_skip=False)
    assert closed == QueueGate() == QueueGate.from_meta({})
    assert not closed.lets_grant(GpuRequest(gpus=1, priority=10**6))
    assert not closed.lets_release(node(0, 0))


def test_a_grant_counts_overtakes_only_when_it_passes_an_unspent_request() -> None:
    gate = QueueGate.after_pass([GpuRequest(gpus=8)], [5], may_skip=True)
    assert gate.lets_grant(GpuRequest(gpus=1, priority=5)) and gate.counts(GpuRequest(gpus=1, priority=5))
    assert not gate.counts(GpuRequest(gpus=1, priority=6))  # ahead of every unspent request
    assert not gate.lets_grant(GpuRequest(gpus=1, priority=6, gang=GangSpec(2, 2)))
    assert not QueueGate.after_pass([GpuRequest(gpus=8)], [], may_skip=True).counts(GpuRequest(gpus=1))


@pytest.mark.parametrize(
    ("state", "lets"),
    [
        pytest.param(node(1000, 0, 0, 0), False, id="one free GPU: the fraction fits there"),
        pytest.param(node(400, 400, 0, 0), True, id="800 milli free, but 400 on each GPU"),
        pytest.param(node(1000, 1000, 0, 0), False, id="two free GPUs: the whole-GPU request fits"),
        pytest.param(node(400, 0, 0, 0), True, id="400 milli free, 500 wanted"),
        pytest.param(node(500, 0, 0, 0), False, id="500 milli free: the fraction fits"),
        pytest.param(
            node(0, 1000, partitioned=(1,)), True, id="a MIG-partitioned GPU takes no whole request"
        ),
    ],
)
def test_a_release_passes_the_queue_only_while_its_node_fits_no_waiting_request(
    state: NodeState, lets: bool
) -> None:
    gate = QueueGate.after_pass([GpuRequest(gpus=2), GpuRequest(gpu_milli=500)], [], may_skip=True)
    assert gate.lets_release(state) is lets


def test_without_fractional_waiters_one_free_gpu_of_two_wanted_passes() -> None:
    gate = QueueGate.after_pass([GpuRequest(gpus=2)], [], may_skip=True)
    assert gate.lets_release(node(1000, 0, 0, 0))
    assert not gate.lets_release(node(1000, 1000, 0, 0))


def test_the_hold_is_named_by_the_service_order_of_its_request() -> None:
    gate = QueueGate.after_pass([GpuRequest(gpus=8)], [], may_skip=True, bound=8, hold=(1, 40))
    assert QueueGate.from_meta(gate.to_meta()) == gate
    assert gate.behind_hold(0, 1) and gate.behind_hold(1, 41)  # lower priority, or queued later
    assert not gate.behind_hold(2, 99) and not gate.behind_hold(1, 39)
    assert not gate.behind_hold(1, 40)  # the same seq: counted ahead (ties go by id, not known here)
    unheld = QueueGate.after_pass([GpuRequest(gpus=8)], [], may_skip=True, bound=8)
    assert not unheld.behind_hold(-1_000_000, 10**9)  # with no hold, every spent request closes the gate


def test_a_request_queued_without_a_pass_joins_the_gate() -> None:
    gate = QueueGate.after_pass([GpuRequest(gpus=8)], [0], may_skip=True, bound=8)
    queued = gate.queued(GpuRequest(gpus=4, priority=3)).queued(GpuRequest(gpu_milli=300))
    assert (queued.min_gpus, queued.min_milli, queued.unspent_priority) == (4, 300, 3)
    assert queued.open and queued.bound == 8
