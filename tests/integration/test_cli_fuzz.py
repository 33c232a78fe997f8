"""Fuzz: every ``gpupool`` command and option takes a valid value or refuses it, typed, the ledger unchanged.

The options come from the real parser (``fuzz_options.parser_options``): a new option without
values in ``fuzz_options.OPTIONS`` fails :func:`test_every_option_has_values`. Commands that only
read or write the ledger (and those that need a cluster, given a kubeconfig that is missing or
broken) run in-process on SQLite and PostgreSQL: no traceback, exit 0 or 2 (the agent's 3: no
GPU), a refusal says why and leaves every row of every table as it was, and a value its option
must refuse is never accepted. Commands that would start servers, benchmarks or simulations are
parsed only: a value outside the option's range ends in argparse's exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_gpupool.cli import EXIT_BROKEN_PIPE, build_parser, main
from airflow_gpupool.ledger import Ledger
from tests.integration.fuzz_argv import argv, describe, draws_of, leaf_commands
from tests.integration.fuzz_fixtures import LedgerRows, run_main
from tests.integration.fuzz_options import OPTIONS, Drawn

#: Commands run in-process, with options every run gets (a cluster command always gets a kubeconfig,
#: from ``KUBECONFIG``'s values: missing or broken, so no cluster is ever reached).
RUN: dict[tuple[str, ...], tuple[str, ...]] = {
    ("ledger", "init"): ("--url",),
    ("inventory", "load"): ("--url",),
    ("inventory", "sync"): ("--url", "--kubeconfig"),
    ("status",): ("--url",),
    ("reserve",): ("--url",),
    ("explain",): ("--url",),
    ("chain",): ("--url",),
    ("release",): ("--url",),
    ("reap",): ("--url",),
    ("reconcile",): ("--url", "--kubeconfig"),
    ("controller", "run"): ("--url", "--kubeconfig", "--once"),
    ("quota", "apply"): ("--url",),
    ("quota", "list"): ("--url",),
    ("agent", "run"): ("--url", "--once"),
    ("node", "quarantine"): ("--url",),
    ("node", "release"): ("--url",),
}
#: The agent's exit code for a node without GPUs or NVML (a wrong node, not a crash).
EXIT_NO_GPU = 3
PARSER = build_parser()
COMMANDS = leaf_commands(PARSER)
PARSE_ONLY = sorted(set(COMMANDS) - set(RUN) - {()})
FUZZ = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_every_option_has_values() -> None:
    """Each option of the parser has values to draw, and every entry of the table is an option."""
    found = {(o.command, o.name) for options in COMMANDS.values() for o in options}
    listed = {(command, name) for command, names in OPTIONS.items() for name in names}
    assert sorted(found - listed) == [], "options without values in tests/integration/fuzz_options.py"
    assert sorted(listed - found) == [], "values for options the parser does not have"
    assert set(RUN) <= set(COMMANDS)


def _command(names: list[tuple[str, ...]]) -> st.SearchStrategy[tuple[tuple[str, ...], dict[str, Drawn]]]:
    def options(command: tuple[str, ...]) -> st.SearchStrategy[tuple[tuple[str, ...], dict[str, Drawn]]]:
        options = COMMANDS[command] + COMMANDS[()]
        always = {o.name for o in options if o.required} | set(RUN.get(command, ()))
        optional = sorted({o.name for o in options} - always)
        chosen = st.sets(st.sampled_from(optional), max_size=5) if optional else st.just(set())
        return chosen.flatmap(lambda more: draws_of(command, sorted(always | more))).map(
            lambda d: (command, d)
        )

    return st.sampled_from(names).flatmap(options)


@pytest.mark.parametrize("one", sorted(RUN), ids=" ".join)
@FUZZ
@given(data=st.data())
def test_a_command_takes_valid_values_or_refuses_them_unchanged(
    one: tuple[str, ...],
    data: st.DataObject,
    fuzz_url: str,
    fuzz_rows: LedgerRows,
    fuzz_paths: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    command, values = data.draw(_command([one]))
    args = argv(command, values, fuzz_paths)
    before = fuzz_rows.dump()
    code = run_main(main, args)
    out, err = capsys.readouterr()
    what = f"gpupool {' '.join(args)} ({describe(values)})"
    assert "Traceback" not in out + err, what
    allowed = {0, 2, EXIT_NO_GPU} if command == ("agent", "run") else {0, 2}
    assert code in allowed, f"{what}: exit {code}\n{err}"
    if any(valid is False for _value, valid in values.values()):
        assert code != 0, f"{what} was accepted"
    if code != 0:
        assert err.strip(), f"{what}: exit {code} without saying why"
        assert fuzz_rows.dump() == before, f"{what} was refused but changed the ledger"
    elif command == ("reserve",) and "--json" in values:
        _release(fuzz_url, json.loads(out)["id"])


def _release(url: str, reservation_id: str) -> None:
    ledger = Ledger(url)
    try:
        ledger.release(reservation_id, reason="fuzz")
    finally:
        ledger.close()


@settings(max_examples=200, deadline=None)
@given(drawn=_command(PARSE_ONLY))
def test_a_command_that_is_only_parsed_refuses_what_its_options_refuse(
    drawn: tuple[tuple[str, ...], dict[str, Drawn]],
) -> None:
    command, values = drawn
    args = argv(command, values, {"url": "sqlite:////nonexistent/l.db"})
    try:
        PARSER.parse_args(args)
    except SystemExit as e:
        assert e.code == 2
        assert any(valid is not True for _value, valid in values.values()), f"{args} refused"
        return
    assert all(valid is not False for _value, valid in values.values()), f"{args} accepted"


BAD_URLS = [
    "",
    "nonsense",
    "mysql://root@127.0.0.1/x",
    "postgresql+nosuchdriver://postgres@127.0.0.1:5432/test",
    "sqlite+nosuch:///x.db",
    "sqlite:////proc/gpupool/x.db",
    "postgresql://postgres@127.0.0.1:99999/test",
    "postgresql://gpupool_no_such_role@127.0.0.1:5432/test",
    "postgresql://postgres@127.0.0.1:5432/gpupool_no_such_database",
    "http://example.invalid/ledger",
]


@pytest.mark.parametrize("url", BAD_URLS)
@pytest.mark.parametrize("command", [("ledger", "init"), ("status",), ("quota", "list")])
def test_a_bad_ledger_url_is_refused_typed(
    url: str, command: tuple[str, ...], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code = run_main(main, [*command, f"--url={url}"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code == 2 and "error: " in err, f"{command} --url={url!r}: {code} {err}"


def test_the_issue_examples_are_refused(
    fuzz_url: str, fuzz_rows: LedgerRows, fuzz_paths: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The malformed inputs issue 38 found (each once, by name), refused with the ledger unchanged."""
    before = fuzz_rows.dump()
    url = f"--url={fuzz_url}"
    for args in (
        ["ledger", "init", "--url=sqlite:////proc/x.db"],
        ["metrics", "serve", "--bind", "not an ip", url],
        ["metrics", "serve", "--bind", "999.1.1.1", url],
        ["agent", "run", "--node", "n1", "--interval", "0", "--once", url],
        ["agent", "run", "--node", "n1", "--interval", "nan", "--once", url],
        [
            "agent",
            "run",
            "--node",
            "n1",
            "--backend",
            "fake",
            "--fake-spec",
            fuzz_paths["missing"],
            "--once",
            url,
        ],
        [
            "agent",
            "run",
            "--node=",
            "--backend",
            "fake",
            "--fake-spec",
            fuzz_paths["fake_spec"],
            "--once",
            url,
        ],
        ["inventory", "load", fuzz_paths["bad_inventory"], url],
        ["node", "quarantine", "n1", "--reason=", url],
        ["status", "--kubeconfig", fuzz_paths["missing"], url],
        ["reserve", "--gpus", "1", "--ttl", "1e300", url],
        ["reserve", "--gpus", "0", url],
        ["status", "--url=postgresql+nosuchdriver://postgres@127.0.0.1:5432/test"],
    ):
        code = run_main(main, args)
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err, args
        assert code == 2 and err.strip(), (args, code, err)
        assert "reservation id" not in err, args  # no id printed for a request refused before it is sent
    missing_kubeconfig = run_main(main, ["status", "--kubeconfig", fuzz_paths["missing"], url])
    assert missing_kubeconfig == 2 and fuzz_paths["missing"] in capsys.readouterr().err
    both = Path(fuzz_paths["folder"]) / "both.yaml"
    both.write_text("nodes:\n  - {name: n3, cpu: 4, cpu_milli: 4000}\n")
    assert run_main(main, ["inventory", "load", str(both), url]) == 2
    assert "either cpu or cpu_milli" in capsys.readouterr().err
    assert fuzz_rows.dump() == before


def test_a_reader_that_leaves_early_ends_the_command_quietly(fuzz_url: str) -> None:
    """``gpupool status --json | head``: the pipe closed before the output, no BrokenPipeError shown."""
    command = [sys.executable, "-m", "airflow_gpupool.cli", "status", "--json", f"--url={fuzz_url}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before the command has written anything
    err = process.stderr.read()
    assert process.wait(timeout=120) == EXIT_BROKEN_PIPE
    assert "Traceback" not in err and "BrokenPipe" not in err, err
