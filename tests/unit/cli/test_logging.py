"""The ``gpupool`` command logs to standard error, and run in-process it leaves no closed stream behind."""

from __future__ import annotations

import io
import logging
import re
import sys
from pathlib import Path

import pytest

from airflow_gpupool.cli import main

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        pytest.param([], ["WARNING gpupool_cli_test: a warning"], id="default"),
        pytest.param(
            ["-v"],
            ["INFO gpupool_cli_test: some info", "WARNING gpupool_cli_test: a warning"],
            id="verbose",
        ),
    ],
)
def test_a_record_logged_after_the_command_goes_to_the_stderr_of_its_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], expected: list[str]
) -> None:
    # pytest swaps sys.stderr for a capture stream per test and closes it when the test ends: the
    # command's handler must not keep that stream, or every later record prints "Logging error".
    during = io.StringIO()
    monkeypatch.setattr(sys, "stderr", during)
    assert main([*flags, "traces", "synth", "--dir", str(tmp_path), "--nodes", "0"]) == 2
    during.close()
    after = io.StringIO()
    monkeypatch.setattr(sys, "stderr", after)

    # A logger of its own: the controller and agent commands, run in-process by other tests, set
    # the level of ``airflow_gpupool`` for good; this one takes the root's, which main() set.
    log = logging.getLogger("gpupool_cli_test")
    log.info("some info")
    log.warning("a warning")

    lines = after.getvalue().splitlines()
    assert len(lines) == len(expected), after.getvalue()
    for line, want in zip(lines, expected, strict=True):
        assert re.fullmatch(f"{STAMP} {re.escape(want)}", line), after.getvalue()
