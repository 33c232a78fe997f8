"""``prefer_node_labels``: matching nodes first among equals, never a reason to turn a request away."""

from __future__ import annotations

import pytest

from airflow_gpupool.placement import Assignment, ClusterSnapshot, GpuState, NodeState, get_policy
from airflow_gpupool.resources import GpuRequest

NVME = (("storage", "nvme"),)


def node(name: str, labels: tuple[tuple[str, str], ...] = (), free: int = 1000) -> NodeState:
    return NodeState(name, 64000, 262144, (GpuState(0, "A100", 40960, free_milli=free),), labels=labels)


#: Eight identical nodes, one with local NVMe: every policy scores them equally.
EQUALS = ClusterSnapshot(tuple(node(f"n{i}", NVME if i == 5 else ()) for i in range(8)))


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_a_preferred_node_wins_among_equals(fast: bool, seed: int) -> None:
    policy = get_policy("gpupool", seed=seed, fast=fast)
    request = GpuRequest(gpus=1, prefer_node_labels={"storage": "nvme"})

    verdict = policy.place(EQUALS, request)

    assert isinstance(verdict, Assignment) and verdict.node == "n5"
    # Without the preference the seeded order decides, and it is not n5 for every seed.
    plain = {get_policy("gpupool", seed=s).place(EQUALS, GpuRequest(gpus=1)).node for s in range(6)}  # type: ignore[union-attr]
    assert plain != {"n5"}


@pytest.mark.parametrize("policy_name", ["gpupool", "fgd", "bestfit"])
def test_a_preference_never_fails_a_request(policy_name: str) -> None:
    # The NVMe node is full: the request goes elsewhere instead of waiting for it.
    cluster = ClusterSnapshot((node("nvme", NVME, free=0), node("plain")))

    verdict = get_policy(policy_name).place(
        cluster, GpuRequest(gpus=1, prefer_node_labels={"storage": "nvme"})
    )

    assert isinstance(verdict, Assignment) and verdict.node == "plain"


def test_a_preference_does_not_override_a_better_score() -> None:
    # bestfit prefers the fuller GPU: the preference only breaks ties, it does not move the request.
    cluster = ClusterSnapshot((node("nvme", NVME, free=1000), node("full", free=300)))

    verdict = get_policy("bestfit").place(
        cluster, GpuRequest(gpu_milli=250, prefer_node_labels={"storage": "nvme"})
    )

    assert isinstance(verdict, Assignment) and verdict.node == "full"


def test_the_preference_survives_serialization() -> None:
    request = GpuRequest(gpus=1, prefer_node_labels={"storage": "nvme"})

    assert GpuRequest.from_dict(request.to_dict()) == request
    assert GpuRequest.from_dict({"gpus": 1}).prefer_node_labels == ()  # rows written before it
