"""Refs A/B: the ledger benchmarks of two git refs of this repository, interleaved in one run.

A change that should not move the numbers ("move, no behaviour change") is shown so by measuring
both trees in the same run: on a shared machine two runs of one tree minutes apart differ by a
factor 1.3 or more, so numbers from different sessions say nothing. Each ref is checked out once
(``git worktree add --detach`` into a temporary folder, removed at the end, also on Ctrl-C), or
``WORKTREE`` is the working tree as it is, uncommitted changes included. Then, per backend and
bench, every round runs A B B A (before, after, after, before), so the machine's drift and the
warm-up fall on both alike. Each run is ``python -m airflow_gpupool.cli bench ... --json`` in a
subprocess with ``PYTHONPATH`` at that ref's checkout (only the CLI is used: the refs' module
paths differ), on a fresh ledger: a new SQLite file, or a PostgreSQL database created for the run
and dropped after it.

Reported per backend and bench: each run's headline numbers (``bench ledger``: cycles_per_s and
reserve_p99_ms; ``bench queue --baseline``: ratio, the cycles with waiters over the same run's
baseline without, and cycles_per_s), each round's after/before ratio (mean of its two B runs over
the mean of its two A runs), their median and min-max, and the same-ref spread (A2/A1 and
B2/B1 of each round: what the noise alone does).

Usage (any interpreter with the project installed; the script imports nothing from it)::

    .venv/bin/python benchmarks/refs_ab.py --before 5262085 --after HEAD --rounds 3 \\
        --backend sqlite --backend postgres
    .venv/bin/python benchmarks/refs_ab.py --before main --bench ledger --rounds 1 --seconds 2 --json
    .venv/bin/python benchmarks/refs_ab.py --before HEAD~1 --after HEAD --backend postgres \\
        --bench queue --queue-args "--waiters 10000 --clients 8"
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: ``--after``'s default: the working tree itself, uncommitted changes included.
WORKTREE = "WORKTREE"

#: Defaults sized for a 2-core machine (``--seconds`` and ``--ledger-args``/``--queue-args`` override).
BENCH_ARGS: dict[str, list[str]] = {
    "ledger": ["--clients", "4", "--nodes", "200", "--seconds", "5"],
    "queue": ["--baseline", "--waiters", "1000", "--clients", "2", "--seconds", "6", "--phase-s", "3"],
}

#: The headline numbers of each bench's JSON, and whether more is better.
METRICS: dict[str, dict[str, bool]] = {
    "ledger": {"cycles_per_s": True, "reserve_p99_ms": False},
    "queue": {"ratio": True, "cycles_per_s": True},
}

#: Order of the runs inside a round: A B B A, as ``bench queue --baseline``'s phases.
ROUND = ("before", "after", "after", "before")

BACKENDS = ("sqlite", "postgres")


class RunFailed(RuntimeError):
    """A bench run exited non-zero, timed out or printed no JSON."""

    def __init__(self, label: str, command: list[str], why: str, stderr: str) -> None:
        super().__init__(f"{label}: {why}")
        self.label, self.command, self.why, self.stderr = label, command, why, stderr


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@contextlib.contextmanager
def checkout(repo: Path, ref: str, scratch: Path) -> Iterator[tuple[Path, str]]:
    """Yield a folder holding ``ref``'s tree and the commit it names (the repo itself for WORKTREE)."""
    if ref == WORKTREE:
        dirty = _git(repo, "status", "--porcelain", "--untracked-files=no")
        yield repo, _git(repo, "rev-parse", "--short=10", "HEAD") + ("+dirty" if dirty else "")
        return
    commit = _git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}")
    where = scratch / f"tree-{commit[:10]}"
    _git(repo, "worktree", "add", "--detach", str(where), commit)
    try:
        yield where, commit[:10]
    finally:
        # --force: the benches leave __pycache__ behind, which would block a plain remove. (No
        # `worktree prune`: it would also drop other people's stale entries.)
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(where)], check=False)


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)  # ahead of the editable install's .pth entry
    return env


def check_import(python: str, tree: Path) -> None:
    """Fail early if ``PYTHONPATH`` does not make ``tree``'s package the one imported."""
    done = subprocess.run(
        [python, "-c", "import airflow_gpupool; print(airflow_gpupool.__file__)"],
        capture_output=True,
        text=True,
        env=_env(tree),
        cwd=tree,
    )
    found = Path(done.stdout.strip() or "?").resolve()
    if done.returncode or not found.is_relative_to(tree.resolve()):
        raise SystemExit(f"PYTHONPATH={tree} imports {found} ({done.stderr.strip()[-500:]})")


@contextlib.contextmanager
def fresh_ledger(backend: str, pg_url: str, scratch: Path, name: str) -> Iterator[str]:
    """Yield the URL of an empty ledger for one run; drop it afterwards."""
    if backend == "sqlite":
        folder = scratch / name
        folder.mkdir()
        yield f"sqlite:///{folder / 'ledger.db'}"  # an absolute path: sqlite:////tmp/...
        return
    import psycopg  # the project's own driver; only needed for PostgreSQL

    admin = f"{pg_url}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{pg_url}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            # FORCE: a bench killed mid-run may leave its clients connected; only this run's database.
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_bench(
    python: str, tree: Path, bench: str, url: str, args: list[str], timeout: float, label: str
) -> dict[str, Any]:
    command = [python, "-m", "airflow_gpupool.cli", "bench", bench, "--url", url, *args, "--json"]
    # cwd=tree: ``python -m`` puts the working folder first on sys.path, ahead of PYTHONPATH.
    # A session of its own: on timeout or Ctrl-C the bench's client processes go with it.
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tree),
        cwd=tree,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise RunFailed(label, command, f"timed out after {timeout:g} s", stderr) from None
        raise
    if proc.returncode:
        raise RunFailed(label, command, f"exit code {proc.returncode}", stderr + stdout[-2000:])
    try:
        return dict(json.loads(stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError):
        raise RunFailed(label, command, "no JSON on stdout", stderr + stdout[-2000:]) from None


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.mean(known) if known else None


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return round(top / bottom, 3) if top is not None and bottom else None


def summarize(runs: list[dict[str, Any]], metrics: dict[str, bool], rounds: int) -> dict[str, Any]:
    """Per metric: each run's value by ref, each round's after/before ratio, its median and range."""
    out: dict[str, Any] = {}
    for metric, higher_is_better in metrics.items():
        per_round: list[float | None] = []
        same_ref: list[float | None] = []
        for k in range(rounds):
            mine = [r for r in runs if r["round"] == k]
            if len(mine) < len(ROUND):
                continue  # a failed round: nothing to pair
            a = [r["values"].get(metric) for r in mine if r["ref"] == "before"]
            b = [r["values"].get(metric) for r in mine if r["ref"] == "after"]
            per_round.append(_ratio(_mean(b), _mean(a)))
            # Second run of a ref over its first: how far the noise alone moves a number.
            same_ref += [_ratio(a[1], a[0]), _ratio(b[1], b[0])]
        known = [r for r in per_round if r is not None]
        spread = [r for r in same_ref if r is not None]
        out[metric] = {
            "higher_is_better": higher_is_better,
            "before": [r["values"].get(metric) for r in runs if r["ref"] == "before"],
            "after": [r["values"].get(metric) for r in runs if r["ref"] == "after"],
            "round_ratios": per_round,
            "median_ratio": round(statistics.median(known), 3) if known else None,
            "min_ratio": min(known) if known else None,
            "max_ratio": max(known) if known else None,
            "same_ref_min": min(spread) if spread else None,
            "same_ref_max": max(spread) if spread else None,
        }
    return out


def _fmt(values: list[Any]) -> str:
    return ", ".join("-" if v is None else f"{v:g}" for v in values)


def print_table(report: dict[str, Any]) -> None:
    before, after = report["before"], report["after"]
    print(f"\nA = before {before['ref']} ({before['commit']}), B = after {after['ref']} ({after['commit']})")
    print(
        f"rounds: {report['rounds']} x A B B A; load average {report['load_before']} -> {report['load_after']}"
    )
    rows = [
        ("backend", "bench", "metric", "A runs", "B runs", "B/A per round", "median", "min-max", "A/A, B/B")
    ]
    for entry in report["results"]:
        for metric, m in entry["metrics"].items():
            arrow = "" if m["higher_is_better"] else " (lower better)"
            rows.append(
                (
                    entry["backend"],
                    entry["bench"],
                    metric + arrow,
                    _fmt(m["before"]),
                    _fmt(m["after"]),
                    _fmt(m["round_ratios"]),
                    _fmt([m["median_ratio"]]),
                    f"{_fmt([m['min_ratio']])}-{_fmt([m['max_ratio']])}",
                    f"{_fmt([m['same_ref_min']])}-{_fmt([m['same_ref_max']])}",
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for failure in report["failed"]:
        print(
            f"\nFAILED {failure['run']}: {failure['why']}\n  {failure['command']}\n{failure['stderr_tail']}"
        )


def _bench_args(bench: str, args: argparse.Namespace) -> list[str]:
    extra = list(BENCH_ARGS[bench])
    if args.seconds is not None:
        extra += ["--seconds", f"{args.seconds:g}"]
        if bench == "queue":  # keep at least two phases per side, so A B B A happens inside the run too
            extra += ["--phase-s", f"{min(3.0, args.seconds / 2):g}"]
    # Appended last: the CLI's argparse keeps the last value of an option given twice.
    return extra + shlex.split(args.ledger_args if bench == "ledger" else args.queue_args)


def measure(
    args: argparse.Namespace, trees: dict[str, Path], scratch: Path, log: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    results: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    counter = itertools.count()
    for backend in args.backend:
        for bench in args.bench:
            bench_args = _bench_args(bench, args)
            runs: list[dict[str, Any]] = []
            try:
                for k in range(args.rounds):
                    for ref in ROUND:
                        label = f"{backend} {bench} round {k + 1} {ref}"
                        name = f"gpupool_ab_{os.getpid()}_{next(counter)}"
                        started = time.monotonic()
                        with fresh_ledger(backend, args.pg_url, scratch, name) as url:
                            answer = run_bench(
                                args.python, trees[ref], bench, url, bench_args, args.timeout, label
                            )
                        values = {m: answer.get(m) for m in METRICS[bench]}
                        took = round(time.monotonic() - started, 1)
                        runs.append(
                            {
                                "round": k,
                                "ref": ref,
                                "values": values,
                                "wall_s": took,
                                "violations": answer.get("violations"),
                            }
                        )
                        print(f"{label}: {json.dumps(values)} ({took} s)", file=log, flush=True)
            except RunFailed as exc:
                # The rest of this backend and bench is skipped; the others still run.
                tail = "\n".join(exc.stderr.strip().splitlines()[-args.tail :])
                failed.append(
                    {
                        "run": exc.label,
                        "why": exc.why,
                        "command": shlex.join(exc.command),
                        "stderr_tail": tail,
                    }
                )
                print(f"{exc.label}: FAILED ({exc.why})", file=log, flush=True)
            results.append(
                {
                    "backend": backend,
                    "bench": bench,
                    "args": bench_args,
                    "runs": runs,
                    "metrics": summarize(runs, METRICS[bench], args.rounds),
                }
            )
    return results, failed


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM too: the finally blocks remove the checkouts and databases


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", required=True, help="the ref measured as A (a commit, branch or tag)")
    parser.add_argument(
        "--after", default=WORKTREE, help=f"the ref measured as B (default: {WORKTREE}, the working tree)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of A B B A per backend and bench (default 3)"
    )
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="repeatable (default: both)")
    parser.add_argument(
        "--bench", action="append", choices=tuple(BENCH_ARGS), help="repeatable (default: both)"
    )
    parser.add_argument(
        "--seconds",
        type=float,
        help="each run's --seconds, both benches (default: ledger 5, queue 6; queue phases 3 s or half of it)",
    )
    parser.add_argument(
        "--ledger-args", default="", help='extra arguments to "bench ledger", e.g. "--clients 16"'
    )
    parser.add_argument(
        "--queue-args", default="", help='extra arguments to "bench queue", e.g. "--waiters 10000"'
    )
    parser.add_argument(
        "--pg-url",
        default="postgresql://postgres@127.0.0.1:5432",
        help="the PostgreSQL server, no database: one is created and dropped per run",
    )
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs the benches")
    parser.add_argument("--timeout", type=float, default=600, help="seconds before a run counts as failed")
    parser.add_argument("--tail", type=int, default=30, help="lines of a failed run's stderr to print")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args()
    args.backend = args.backend or list(BACKENDS)
    args.bench = args.bench or list(BENCH_ARGS)
    args.pg_url = args.pg_url.rstrip("/")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    signal.signal(signal.SIGTERM, _interrupt)
    repo = Path(_git(Path(__file__).resolve().parent, "rev-parse", "--show-toplevel"))
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="refs-ab-") as tmp, contextlib.ExitStack() as stack:
        scratch = Path(tmp)
        trees: dict[str, Path] = {}
        commits: dict[str, str] = {}
        for side in ("before", "after"):
            trees[side], commits[side] = stack.enter_context(checkout(repo, getattr(args, side), scratch))
            check_import(args.python, trees[side])
        results, failed = measure(args, trees, scratch, sys.stderr)
    report = {
        "before": {"ref": args.before, "commit": commits["before"]},
        "after": {"ref": args.after, "commit": commits["after"]},
        "rounds": args.rounds,
        "order": "".join("A" if r == "before" else "B" for r in ROUND),
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "cpu_count": os.cpu_count(),
        "results": results,
        "failed": failed,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)
    if failed and args.json:  # the table prints them already
        for failure in failed:
            print(f"FAILED {failure['run']}: {failure['why']}\n{failure['stderr_tail']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the checkouts and databases are gone by now
        sys.exit("interrupted")
