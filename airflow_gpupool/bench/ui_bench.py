"""``gpupool bench ui``: the GPU pool page's size and time to serve on a big cluster.

Builds a SQLite ledger of ``nodes`` nodes (the ledger bench's inventory: 1,000 nodes are
7,200 GPUs in three node pools), ``grants`` live grants held by task tries and ``waiting``
requests, then requests the page's refresh (``/?partial=1``) through the real app, in the
same run:

* **baseline**: every node drawn and every grant and waiter listed, the ledger read again for
  each request: what the page did before it was grouped by node pool and cached;
* **refresh**: the page as served now: pools closed (their summaries), tables capped, the
  process's cached reading (``cold``: the request that reads the ledger when the cache is stale).

The app comes from the caller (``make_app``), so this module stays below the plugin's layer.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_gpupool.bench.ledger_bench import bench_inventory
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.task_try import TaskTry

#: Request shapes of the A100 grants, in turn: a whole A100, half an A100, two A100s.
_SHAPES = (
    GpuRequest(gpus=1, gpu_models=frozenset({"A100-SXM4-80GB"}), team="vision"),
    GpuRequest(gpu_milli=500, gpu_models=frozenset({"A100-SXM4-80GB"}), team="nlp"),
    GpuRequest(gpus=2, gpu_models=frozenset({"A100-SXM4-80GB"}), team="research"),
)
_T4 = GpuRequest(gpus=1, gpu_models=frozenset({"T4"}), team="inference")


def build_ledger(url: str, nodes: int, grants: int, waiting: int) -> Ledger:
    """Create the bench ledger at ``url``: the inventory, ``grants`` grants, ``waiting`` waiters.

    Every T4 is granted first (when ``grants`` allows), the rest are A100 grants, so the
    waiters (one T4 each) wait, as a busy cluster's queue does.
    """
    inventory = bench_inventory(nodes)
    ledger = Ledger.create(url)
    ledger.upsert_nodes(inventory)
    t4 = min(grants, sum(len(n.gpus) for n in inventory if n.node_pool == "t4"))

    def holder(i: int) -> str:
        return TaskTry(f"dag_{i % 40}", "train", f"manual__{i}", -1, 1, "worker").holder

    for i in range(grants):
        ledger.reserve(_T4 if i < t4 else _SHAPES[i % len(_SHAPES)], holder(i), ttl=7 * 86400)
    for i in range(waiting):
        ledger.reserve(_T4, holder(grants + i), timeout=7 * 86400)
    return ledger


def _timed_get(
    client: Any, params: dict[str, Any], before: Callable[[], None] | None = None
) -> tuple[float, int]:
    if before is not None:
        before()
    started = time.perf_counter()
    response = client.get("/", params=params)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed, len(response.content)


def _summary(samples: list[tuple[float, int]]) -> dict[str, float]:
    times = [t for t, _ in samples]
    return {
        "ms_median": round(statistics.median(times) * 1000, 1),
        "ms_max": round(max(times) * 1000, 1),
        "kb": round(samples[-1][1] / 1024, 1),
    }


def run_ui_bench(
    make_app: Callable[[Ledger], Any],
    *,
    nodes: int = 1000,
    grants: int = 2000,
    waiting: int = 50,
    requests: int = 20,
) -> dict[str, Any]:
    """Run the benchmark and return its numbers.

    :param make_app: builds the GPU pool app over a ledger, with a user already logged in
    :param requests: requests measured per case (the baseline gets at most 5: it is slow)
    """
    from fastapi.testclient import TestClient

    workdir = Path(tempfile.mkdtemp(prefix="gpupool-bench-ui-"))
    started = time.perf_counter()
    ledger = build_ledger(f"sqlite:///{workdir / 'ledger.db'}", nodes, grants, waiting)
    built_s = time.perf_counter() - started
    snapshot = ledger.snapshot()
    app = make_app(ledger)
    state = app.state.gpupool
    client = TestClient(app)
    client.get("/", params={"partial": 1}).raise_for_status()  # warm: imports, the first reading
    baseline = [
        _timed_get(client, {"partial": 1, "open": "*", "rows": "all"}, state.invalidate)
        for _ in range(min(requests, 5))
    ]
    cold = [_timed_get(client, {"partial": 1}, state.invalidate) for _ in range(min(requests, 5))]
    client.get("/", params={"partial": 1})
    refresh = [_timed_get(client, {"partial": 1}) for _ in range(requests)]
    ledger.close()
    base, new = _summary(baseline), _summary(refresh)
    return {
        "nodes": len(snapshot.nodes),
        "gpus": sum(len(n.gpus) for n in snapshot.nodes),
        "grants": len(snapshot.grants),
        "waiting": len(snapshot.queue),
        "build_s": round(built_s, 1),
        "baseline": base,
        "refresh_cold": _summary(cold),
        "refresh": new,
        "size_ratio": round(new["kb"] / base["kb"], 4) if base["kb"] else None,
        "time_ratio": round(new["ms_median"] / base["ms_median"], 4) if base["ms_median"] else None,
    }
