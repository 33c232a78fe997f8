"""Fuzz: ``gpupool`` arguments are accepted and valid, or refused with exit 2 and the ledger unchanged.

Surfaces: ``reserve`` (every option) against a real SQLite ledger; the numeric options of
``bench``, ``metrics serve``, ``emulator``, ``reconcile`` and ``controller run``, parsed only
(running them would start servers and clients).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_gpupool.cli import build_parser, main
from airflow_gpupool.ledger import Ledger
from tests.ledger_fixtures import node

NUMBERS = st.sampled_from(
    ["0", "-1", "-5", "1", "7", "999", "1000", "99999", "inf", "nan", "-inf", "1e999", "0.5", "", "x", "1.5"]
)
TEXT = st.sampled_from(["", " ", "a", "foo", "k=v", "=v", "gpu=a100", "A100", "1g.10gb", "9g.9gb"])
RESERVE_OPTIONS = {
    "--gpus": NUMBERS,
    "--gpu-milli": NUMBERS,
    "--mig-profile": TEXT,
    "--gpu-memory-mib": NUMBERS,
    "--gpu-model": TEXT,
    "--label": TEXT,
    "--cpu-milli": NUMBERS,
    "--memory-mib": NUMBERS,
    "--workload-class": st.sampled_from(["training", "batch", "gaming", ""]),
    "--priority": NUMBERS,
    "--team": TEXT,
    "--holder": TEXT,
    "--ttl": NUMBERS,
    "--timeout": NUMBERS,
    "--id": TEXT,
    "--capacity": st.sampled_from(["on-demand", "spot", "any", "cheap", ""]),
}


def argv_of(options: dict[str, str]) -> list[str]:
    # "--opt=value" keeps values that start with '-' from being read as options.
    return [f"{name}={value}" for name, value in options.items()]


@pytest.fixture(scope="module")
def ledger_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz')}/ledger.db"
    ledger = Ledger.create(url)
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=1, mig={0: ["1g.10gb"] * 7})])
    ledger.close()
    yield url


def state(url: str) -> object:
    ledger = Ledger(url)
    try:
        snapshot = ledger.snapshot()
        return (snapshot.grants, snapshot.queue, snapshot.nodes)
    finally:
        ledger.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    options=st.dictionaries(st.sampled_from(sorted(RESERVE_OPTIONS)), st.none(), max_size=6).flatmap(
        lambda keys: st.fixed_dictionaries({k: RESERVE_OPTIONS[k] for k in keys})
    )
)
def test_reserve_accepts_valid_arguments_or_refuses_them_unchanged(
    options: dict[str, str], ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = state(ledger_url)
    argv = ["reserve", "--url", ledger_url, "--json", *argv_of(options)]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's usage error
        code = e.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if code == 0:
        ledger = Ledger(ledger_url)
        try:
            rid = out.split('"id": "')[1].split('"')[0]
            ledger.release(rid, reason="fuzz")
        finally:
            ledger.close()
        return
    assert code == 2 and err.strip(), f"{argv}: exit {code} without saying why"
    assert state(ledger_url) == before, f"{argv} was refused but changed the ledger"


PARSE_ONLY = {
    ("bench", "ledger"): {
        "--clients": (1, 256),
        "--nodes": (1, 100_000),
        "--seconds": (0, None),
        "--hold-ms": (0, None),
    },
    ("bench", "operator"): {"--tasks": (1, 1000), "--pod-seconds": (0, None)},
    ("metrics", "serve"): {"--port": (1, 65535)},
    ("reconcile",): {"--grace-seconds": (0, None), "--orphan-grace-seconds": (0, None)},
    ("controller", "run"): {
        "--sync-interval": (0, None),
        "--reconcile-interval": (0, None),
        "--lease-duration": (0, None),
    },
}
COMMANDS = [(cmd, opt) for cmd, opts in PARSE_ONLY.items() for opt in opts]


@settings(max_examples=200, deadline=None)
@given(target=st.sampled_from(COMMANDS), value=NUMBERS)
def test_numeric_options_are_in_range_or_refused(target: tuple[tuple[str, ...], str], value: str) -> None:
    command, option = target
    low, high = PARSE_ONLY[command][option]
    extra = ["--kubeconfig", "/dev/null"] if command[0] == "emulator" else []
    try:
        args = build_parser().parse_args([*command, *extra, f"{option}={value}"])
    except SystemExit as e:
        assert e.code == 2
        return
    parsed = getattr(args, option.lstrip("-").replace("-", "_"))
    assert math.isfinite(parsed) and parsed >= low and (high is None or parsed <= high)


@settings(max_examples=100, deadline=None)
@given(port=NUMBERS, duration=NUMBERS)
def test_emulator_options_are_in_range_or_refused(port: str, duration: str) -> None:
    try:
        args = build_parser().parse_args(
            ["emulator", "--kubeconfig", "k", f"--port={port}", f"--default-duration={duration}"]
        )
    except SystemExit as e:
        assert e.code == 2
        return
    assert 0 <= args.port <= 65535 and math.isfinite(args.default_duration) and args.default_duration >= 0


def test_the_issue_examples_are_refused(
    ledger_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    before = state(ledger_url)
    for argv in (
        ["reserve", "--url", ledger_url, "--gpus", "1", "--label", "foo"],
        ["reserve", "--url", ledger_url, "--id="],
        ["bench", "ledger", "--clients", "0"],
        ["bench", "ledger", "--nodes", "0"],
        ["bench", "ledger", "--hold-ms=-5"],
        ["bench", "ledger", "--seconds=-5"],
        ["metrics", "serve", "--port", "99999"],
        ["emulator", "--kubeconfig", "k", "--port=-1"],
        ["status", "--url", f"sqlite:///{tmp_path}/missing/dir/l.db"],
    ):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        assert code == 2, argv
    capsys.readouterr()
    assert state(ledger_url) == before
