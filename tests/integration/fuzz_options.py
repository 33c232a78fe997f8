"""What the CLI fuzz draws for every option of every ``gpupool`` command.

Each option has :class:`Values`: samples its own check must accept, samples it must refuse, and
optionally hypothesis text judged by a small oracle (None: any text is the option's to take, such
as a path or a name). ``OPTIONS`` is keyed by the command's words and the option (a positional by
its ``dest``); :func:`tests.integration.fuzz_argv.parser_options` walks the real parser, so a new option without an entry
fails ``test_every_option_has_values``. Paths are placeholders (``{inventory}``) that the test
fills with files of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import strategies as st

#: A value and whether the option's own check must accept it (None: it may go either way).
Drawn = tuple[str | None, bool | None]
Judge = Callable[[str], bool | None]

TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)


@dataclass(frozen=True)
class Values:
    """What the fuzz draws for one option."""

    valid: tuple[str, ...] = ()
    invalid: tuple[str, ...] = ()
    judge: Judge | None = None  # hypothesis text too, judged by this
    flag: bool = False

    def strategy(self) -> st.SearchStrategy[Drawn]:
        """Return the draws: ``(value, valid)``; a flag draws ``(None, True)``."""
        if self.flag:
            return st.just((None, True))
        parts: list[st.SearchStrategy[Drawn]] = []
        if self.valid:
            parts.append(st.sampled_from(self.valid).map(lambda v: (v, True)))
        if self.invalid:
            parts.append(st.sampled_from(self.invalid).map(lambda v: (v, False)))
        if self.judge is not None:
            judge = self.judge
            parts.append(TEXT.map(lambda v: (v, judge(v))))
        return st.one_of(parts)


FLAG = Values(flag=True)


def _any(_text: str) -> bool | None:
    return None


def _int_within(low: int | None, high: int | None) -> Judge:
    def judge(text: str) -> bool:
        try:
            value = int(text)
        except ValueError:
            return False
        return (low is None or value >= low) and (high is None or value <= high)

    return judge


def ints(low: int | None = None, high: int | None = None) -> Values:
    """An integer in ``[low, high]``."""
    inside = [str(v) for v in (low, high) if v is not None] or ["0", "-3", "12"]
    outside = [str(low - 1)] if low is not None else []
    outside += [str(high + 1)] if high is not None else []
    return Values(tuple(inside), (*outside, "x", "", "1.5", "nan", "1e3"), _int_within(low, high))


def _number_within(low: float | None, above: bool, high: float | None) -> Judge:
    def judge(text: str) -> bool:
        try:
            value = float(text)
        except ValueError:
            return False
        if not math.isfinite(value):
            return False
        if low is not None and (value <= low if above else value < low):
            return False
        return high is None or value <= high

    return judge


def numbers(low: float | None = 0, *, above: bool = False, high: float | None = None) -> Values:
    """A finite number, at least (``above``: more than) ``low``, at most ``high``."""
    inside = ["0.5", "30"] + ([] if above or low is None else [f"{low:g}"])
    outside = ["nan", "inf", "-inf", "x", "", "1e999"]
    outside += [f"{low - 1:g}"] + ([f"{low:g}"] if above else []) if low is not None else []
    outside += [f"{high * 2:g}"] if high is not None else []
    return Values(tuple(inside), tuple(outside), _number_within(low, above, high))


def checked_when_run(kind: type[int] | type[float]) -> Values:
    """A number the parser only types; the command checks its range before any work (simulate, traces).

    The parse-only fuzz cannot judge those: a number is either way there; not one is refused.
    """

    def judge(text: str) -> bool | None:
        try:
            kind(text)
        except ValueError:
            return False
        return None

    return Values(("1",), ("x", ""), judge)


def choices(*names: str) -> Values:
    return Values(names, ("", "nope", names[0].upper() + "x"), lambda v: v in names)


NON_EMPTY = Values(("a", "gpu-a", "n1"), ("", "  "), lambda v: bool(v.strip()))
KEY_VALUE = Values(
    ("k=v", "gpu=a100"), ("foo", "=v", ""), lambda v: "=" in v and bool(v.split("=")[0].strip())
)
BIND = Values(("127.0.0.1", "localhost", "::1", "0.0.0.0"), ("not an ip", "999.1.1.1", "", "-a", "a..b"))
#: A node's name: the fuzzed ledger's two nodes, so that a command on a node gets that far.
NODE = Values(("n1", "n2"), ("", "  "), lambda v: bool(v.strip()))
#: A reservation id: the fuzzed ledger's own (``held``) or any other.
RESERVATION = Values(("held", "nope"), ("", " "), lambda v: bool(v.strip()))
#: Any text: a file name, a context, a reservation's label.
FREE = Values(("a",), (), _any)
#: A ledger URL: always the test's own in a run (bad URLs have a test of their own).
URL = Values(("{url}",))
#: A kubeconfig: in a run, never a cluster's (the ledger must not change): a missing or broken file.
KUBECONFIG = Values((), ("{missing}", "{junk}", "{folder}"))
SECONDS = numbers(0)
POSITIVE_SECONDS = numbers(0, above=True)
LEASE_SECONDS = numbers(0, above=True, high=366 * 86400)
PORT = ints(1, 65535)
COUNT = ints(1)


def _cluster(**more: Values) -> dict[str, Values]:
    return {"--url": URL, "--kubeconfig": KUBECONFIG, "--context": FREE, "--json": FLAG, **more}


OPTIONS: dict[tuple[str, ...], dict[str, Values]] = {
    (): {"--verbose": FLAG},
    ("ledger", "init"): {"--url": URL},
    ("inventory", "load"): {
        "file": Values(("{inventory}",), ("{missing}", "{folder}", "{bad_inventory}"), _any),
        "--prune": FLAG,
        "--no-init": FLAG,
        "--url": URL,
    },
    ("inventory", "sync"): _cluster(
        **{"--no-prune": FLAG, "--keep-cpu-nodes": FLAG, "--tolerate-taint": NON_EMPTY, "--no-init": FLAG}
    ),
    ("status",): _cluster(),
    ("reserve",): {
        "--url": URL,
        "--gpus": ints(0),
        "--gpu-milli": ints(1, 999),
        "--mig-profile": Values(("1g.10gb", "3g.40gb"), ("", "9g.9gb"), _any),
        "--gpu-memory-mib": ints(1),
        "--gpu-model": NON_EMPTY,
        "--label": KEY_VALUE,
        "--cpu-milli": ints(0),
        "--memory-mib": ints(0),
        "--workload-class": choices("training", "inference", "batch"),
        "--priority": ints(),
        "--priority-class": NON_EMPTY,
        "--kubeconfig": KUBECONFIG,
        "--context": FREE,
        "--preemptible": FLAG,
        "--capacity": choices("on-demand", "spot", "any"),
        "--team": NON_EMPTY,
        "--holder": NON_EMPTY,
        "--ttl": LEASE_SECONDS,
        "--timeout": LEASE_SECONDS,
        "--id": NON_EMPTY,
        "--json": FLAG,
    },
    ("explain",): {"--url": URL, "id": RESERVATION, "--json": FLAG},
    ("chain",): {"--url": URL, "dag_id": NON_EMPTY, "run_id": NON_EMPTY, "--json": FLAG},
    ("release",): {"--url": URL, "id": RESERVATION, "--reason": NON_EMPTY},
    ("reap",): {"--url": URL},
    ("bench", "ledger"): {
        "--url": URL,
        "--clients": ints(1, 256),
        "--seconds": POSITIVE_SECONDS,
        "--nodes": ints(1, 100_000),
        "--hold-ms": SECONDS,
        "--serialized": FLAG,
        "--json": FLAG,
    },
    ("bench", "queue"): {
        "--url": URL,
        "--waiters": ints(0, 100_000),
        "--clients": ints(1, 256),
        "--seconds": POSITIVE_SECONDS,
        "--nodes": ints(1, 10_000),
        "--min-wakeups": ints(0, 100_000),
        "--baseline": FLAG,
        "--phase-s": POSITIVE_SECONDS,
        "--json": FLAG,
    },
    ("bench", "operator"): {"--tasks": ints(1, 1000), "--pod-seconds": SECONDS, "--json": FLAG},
    ("bench", "forecast"): {
        "--url": URL,
        "--nodes": ints(1, 100_000),
        "--waiting": ints(0, 100_000),
        "--samples": ints(1, 4096),
        "--seed": ints(0, 2**31 - 1),
        "--ledger-seconds": SECONDS,
        "--ledger-clients": ints(1, 256),
        "--ledger-rounds": ints(1, 100),
        "--forecast-every": POSITIVE_SECONDS,
        "--json": FLAG,
    },
    ("bench", "heartbeats"): {
        "--url": URL,
        "--nodes": ints(1, 100_000),
        "--interval": POSITIVE_SECONDS,
        "--seconds": POSITIVE_SECONDS,
        "--clients": ints(1, 256),
        "--writers": ints(1, 64),
        "--rounds": ints(1, 100),
        "--json": FLAG,
    },
    ("bench", "ui"): {
        "--nodes": ints(1, 100_000),
        "--grants": ints(0, 100_000),
        "--waiting": ints(0, 100_000),
        "--requests": ints(1, 1000),
        "--json": FLAG,
    },
    ("simulate",): {
        "--mode": choices("fgd", "queue"),
        "--nodes": FREE,
        "--pods": FREE,
        "--policy": FREE,
        "--seed": checked_when_run(int),
        "--json": FLAG,
        "--plot": FREE,
        "--scale": checked_when_run(int),
        "--load": checked_when_run(float),
        "--queue-nodes": checked_when_run(int),
        "--arrivals": checked_when_run(int),
        "--warmup-hours": checked_when_run(float),
        "--hours": checked_when_run(float),
        "--max-overtakes": checked_when_run(int),
        "--teams": FREE,
        "--pipelines": FREE,
        "--pipeline-policy": FREE,  # checked when the command runs, as --policy
        "--scenario": choices("three-teams", "pipelines"),
        "--teams-from": choices("qos"),
        "--forecast": FLAG,
        "--forecast-samples": checked_when_run(int),
        "--quiet": FLAG,
    },
    ("traces", "fetch"): {"--dir": FREE, "--base-url": FREE, "--quiet": FLAG},
    ("traces", "synth"): {
        "--dir": FREE,
        "--nodes": checked_when_run(int),
        "--pods": checked_when_run(int),
        "--seed": checked_when_run(int),
    },
    ("emulator",): {
        "--host": BIND,
        "--port": ints(0, 65535),
        "--kubeconfig": NON_EMPTY,
        "--nodes": FREE,
        "--namespace": NON_EMPTY,
        "--default-duration": SECONDS,
        "--access-log": FLAG,
    },
    ("reconcile",): _cluster(
        **{
            "--grace-seconds": SECONDS,
            "--orphan-grace-seconds": SECONDS,
            "--include-manual": FLAG,
            "--all-nodes": FLAG,
            "--id-prefix": NON_EMPTY,
        }
    ),
    ("controller", "run"): {
        "--url": URL,
        "--kubeconfig": KUBECONFIG,
        "--context": FREE,
        "--sync-interval": POSITIVE_SECONDS,
        "--reconcile-interval": POSITIVE_SECONDS,
        "--gate-interval": POSITIVE_SECONDS,
        "--pod-relist-interval": POSITIVE_SECONDS,
        "--no-external-pods": FLAG,
        "--autoscale-interval": POSITIVE_SECONDS,
        "--namespace": NON_EMPTY,
        "--lease-name": NON_EMPTY,
        "--lease-duration": POSITIVE_SECONDS,
        "--identity": NON_EMPTY,
        "--once": FLAG,
        "--health-port": PORT,
        "--health-bind": BIND,
        "--log-level": choices("DEBUG", "INFO", "WARNING"),
    },
    ("metrics", "serve"): {
        "--port": PORT,
        "--bind": BIND,
        "--drift": FLAG,
        "--kubeconfig": FREE,
        "--context": FREE,
        "--url": URL,
    },
    ("quota", "apply"): {
        "file": Values(("{quota}",), ("{missing}", "{folder}", "{bad_quota}"), _any),
        "--url": URL,
        "--dry-run": FLAG,
        "--strict": FLAG,
        "--json": FLAG,
    },
    ("quota", "list"): {"--url": URL, "--json": FLAG},
    ("agent", "run"): {
        "--url": URL,
        "--node": NON_EMPTY,
        "--interval": POSITIVE_SECONDS,
        "--once": FLAG,
        "--json": FLAG,
        "--no-ledger": FLAG,
        "--backend": choices("nvml", "fake"),
        "--fake-spec": Values(("{fake_spec}",), ("{missing}", "{junk}"), _any),
        "--health-port": PORT,
        "--health-bind": BIND,
    },
    ("node", "quarantine"): {
        "--url": URL,
        "node": NODE,
        "--gpu": NON_EMPTY,
        "--reason": NON_EMPTY,
        "--json": FLAG,
    },
    ("node", "release"): {
        "--url": URL,
        "node": NODE,
        "--gpu": NON_EMPTY,
        "--reason": NON_EMPTY,
        "--json": FLAG,
    },
}
