"""Queue ratio: `gpupool bench queue` with 0, 1 and N waiters, in rounds, their cycles compared.

The bench's answer to "do waiting requests cost the clients anything" is a ratio of two runs on a
shared, noisy machine; one pair says little. This script runs rounds of three runs (0 waiters, 1
waiter, N waiters; the order alternates between rounds) and prints each round's cycles per
second and ratios, then their median and mean.

With ``--interleaved`` each round is instead two interleaved runs (``bench queue --baseline``:
the run and its baseline without waiters in turns on two ledgers, so both see the machine's
load alike): N waiters against none, and none against none, whose ratio shows what is left of
the noise (it should be 1). Its phases last ``--phase-s`` (5 s: about 20 nodes turned over each,
so a phase spans many of the waiters' grant, wake-up and new-request turns).

Usage (``PYTHONPATH`` names the tree to measure)::

    PYTHONPATH=. python benchmarks/queue_ratio.py --url postgresql://postgres@127.0.0.1:5432/test_queue --clients 8
    PYTHONPATH=. python benchmarks/queue_ratio.py --url sqlite:////tmp/qr.db --clients 4
    PYTHONPATH=. python benchmarks/queue_ratio.py --url postgresql://postgres@127.0.0.1:5432/test_queue \
        --clients 8 --seconds 20 --interleaved --phase-s 5
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


def _run(url: str, waiters: int, clients: int, seconds: float, *extra: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        if url.startswith("sqlite"):  # the bench wants a new file each run
            url = f"sqlite:///{Path(scratch) / 'queue.db'}"
        command = [sys.executable, "-m", "airflow_gpupool.cli", "bench", "queue", "--url", url]
        command += ["--waiters", str(waiters), "--clients", str(clients), "--seconds", str(seconds), "--json"]
        command += extra
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
    parser.add_argument("--interleaved", action="store_true", help="each round: two runs with --baseline")
    parser.add_argument("--phase-s", type=float, default=5.0, help="seconds per phase with --interleaved")
    args = parser.parse_args()
    if args.interleaved:
        _interleaved(args)
        return
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


def _interleaved(args: argparse.Namespace) -> None:
    many, ratios, noise = args.waiters, [], []
    for _ in range(args.rounds):
        phases = ("--baseline", "--phase-s", str(args.phase_s))
        runs = {w: _run(args.url, w, args.clients, args.seconds, *phases) for w in (many, 0)}
        ratios.append(runs[many]["ratio"])
        noise.append(runs[0]["ratio"])
        line = {
            "cycles_per_s": {w: [runs[w]["cycles_per_s"], runs[w]["baseline_cycles_per_s"]] for w in runs},
            f"ratio_{many}": ratios[-1],
            "ratio_0_against_0": noise[-1],
            "nodes_turned_over": {
                w: [runs[w]["nodes_turned_over"], runs[w]["baseline_nodes_turned_over"]] for w in runs
            },
            "waiter_cpu_percent": runs[many]["waiter_cpu_percent"],
            "violations": sum(r["violations"] for r in runs.values()),
        }
        print(json.dumps(line), flush=True)
    summary = {
        f"median_ratio_{many}": round(statistics.median(ratios), 3),
        "mean": round(statistics.mean(ratios), 3),
        "min": min(ratios),
        "median_ratio_0_against_0": round(statistics.median(noise), 3),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
