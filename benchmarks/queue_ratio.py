"""Queue ratio: `gpupool bench queue` with 0, 1 and N waiters, in rounds, their cycles compared.

The bench's answer to "do waiting requests cost the clients anything" is a ratio of two runs on a
shared, noisy machine; one pair says little. This script runs rounds of three runs (0 waiters, 1
waiter, N waiters; the order alternates between rounds) and prints each round's cycles per
second and ratios, then their median and mean.

Usage (``PYTHONPATH`` names the tree to measure)::

    PYTHONPATH=. python benchmarks/queue_ratio.py --url postgresql://postgres@127.0.0.1:5432/test_queue --clients 8
    PYTHONPATH=. python benchmarks/queue_ratio.py --url sqlite:////tmp/qr.db --clients 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def _run(url: str, waiters: int, clients: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        if url.startswith("sqlite"):  # the bench wants a new file each run
            url = f"sqlite:///{Path(scratch) / 'queue.db'}"
        command = [sys.executable, "-m", "airflow_gpupool.cli", "bench", "queue", "--url", url]
        command += ["--waiters", str(waiters), "--clients", str(clients), "--seconds", str(seconds), "--json"]
        done = subprocess.run(command, capture_output=True, text=True, check=True, env=os.environ)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", required=True, help="a PostgreSQL database, or any SQLite URL (a new file per run)"
    )
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--waiters", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    many = args.waiters
    ratios: list[float] = []
    for k in range(args.rounds):
        order = [0, many, 1] if k % 2 == 0 else [many, 1, 0]
        runs = {w: _run(args.url, w, args.clients, args.seconds) for w in order}
        cycles = {w: runs[w]["cycles_per_s"] for w in (0, 1, many)}
        ratios.append(cycles[many] / cycles[0])
        line = {
            "cycles_per_s": cycles,
            f"ratio_{many}": round(ratios[-1], 2),
            "ratio_1": round(cycles[1] / cycles[0], 2),
            "nodes_turned_over": {w: runs[w]["nodes_turned_over"] for w in (0, 1, many)},
            f"wakeup_p99_ms_{many}": runs[many]["wakeup_p99_ms"],
            "violations": sum(r["violations"] for r in runs.values()),
        }
        print(json.dumps(line), flush=True)
    print(
        json.dumps(
            {
                f"median_ratio_{many}": round(statistics.median(ratios), 2),
                "mean": round(statistics.mean(ratios), 3),
            }
        )
    )


if __name__ == "__main__":
    main()
