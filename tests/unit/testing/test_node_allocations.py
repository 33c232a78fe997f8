"""The emulator scheduler's cache (:class:`NodeAllocations`) against a full count of the pods.

The cache follows every stored pod change instead of reading every pod for each placement; it
must agree with :func:`used_resources` over the live pods after any sequence of changes: binds,
the end of a pod, a ``Terminating`` pod (which still holds), deletion and a name reused elsewhere.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpupool.testing.cluster.scheduling import NodeAllocations, used_resources

NODES = ("a", "b", "c")
NAMES = ("p0", "p1", "p2", "p3")


def pod(name: str, node: str | None, gpus: int, phase: str = "Pending") -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": resources}]}
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec, "status": {"phase": phase}}


changes = st.lists(
    st.tuples(
        st.sampled_from(("create", "bind", "run", "finish", "terminating", "delete")),
        st.sampled_from(NAMES),
        st.sampled_from((None, *NODES)),
        st.integers(min_value=0, max_value=3),
    ),
    max_size=40,
)


def apply(live: dict[str, dict[str, Any]], change: tuple[str, str, str | None, int]) -> dict[str, Any] | None:
    """Apply one change to the live pods; return the watch event it makes, or ``None``."""
    what, name, node, gpus = change
    current = live.get(name)
    if what == "create" and current is None:
        live[name] = pod(name, node, gpus)
        return {"type": "ADDED", "object": live[name]}
    if current is None or what == "create":
        return None
    if what == "delete":
        return {"type": "DELETED", "object": live.pop(name)}
    changed = {**current, "spec": dict(current["spec"]), "status": dict(current["status"])}
    changed["metadata"] = dict(current["metadata"])
    if what == "bind" and node is not None and not current["spec"].get("nodeName"):
        changed["spec"]["nodeName"] = node
    elif what == "run":
        changed["status"]["phase"] = "Running"
    elif what == "finish":
        changed["status"]["phase"] = "Succeeded" if gpus % 2 else "Failed"
    elif what == "terminating":
        changed["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    live[name] = changed
    return {"type": "MODIFIED", "object": changed}


@settings(max_examples=300, deadline=None)
@given(changes)
def test_the_cache_agrees_with_a_full_count_after_any_changes(
    steps: list[tuple[str, str, str | None, int]],
) -> None:
    live: dict[str, dict[str, Any]] = {}
    cache = NodeAllocations()
    for step in steps:
        event = apply(live, step)
        if event is not None:
            cache.observe(event)
        for node in NODES:
            counted = {k: v for k, v in used_resources(node, live.values()).items() if v}
            assert {k: v for k, v in cache.used(node).items() if v} == counted, (node, step)
            for other in live.values():
                without = [p for p in live.values() if p is not other]
                expected = {k: v for k, v in used_resources(node, without).items() if v}
                assert {k: v for k, v in cache.used(node, excluding=other).items() if v} == expected


def test_a_terminating_pod_still_holds_and_a_deleted_one_frees() -> None:
    cache = NodeAllocations()
    running = pod("train", "a", 2, phase="Running")
    cache.observe({"type": "ADDED", "object": running})
    terminating = {
        **running,
        "metadata": {**running["metadata"], "deletionTimestamp": "2026-12-07T00:00:00Z"},
    }
    cache.observe({"type": "MODIFIED", "object": terminating})
    assert cache.used("a") == {"nvidia.com/gpu": 2.0}
    cache.observe({"type": "DELETED", "object": terminating})
    assert cache.used("a") == {}
