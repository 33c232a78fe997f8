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

    # A logger of its own: it takes the root's level, which main() set, whatever other tests did to
    # the level of ``airflow_gpupool``.
    log = logging.getLogger("gpupool_cli_test")
    log.info("some info")
    log.warning("a warning")

    lines = after.getvalue().splitlines()
    assert len(lines) == len(expected), after.getvalue()
    for line, want in zip(lines, expected, strict=True):
        assert re.fullmatch(f"{STAMP} {re.escape(want)}", line), after.getvalue()


@pytest.mark.parametrize(
    "argv",
    [
        # Each fails on its configuration (exit 2) after setting the level: quick, no cluster, no GPU.
        pytest.param(["agent", "run", "--node", "n1", "--once", "--backend", "fake"], id="agent"),
        pytest.param(["controller", "run", "--once", "--kubeconfig", "no-kubeconfig"], id="controller"),
    ],
)
def test_a_daemon_command_run_in_process_restores_the_level_of_the_package_logger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    logger = logging.getLogger("airflow_gpupool")
    before = logger.level
    logger.setLevel(logging.ERROR)  # neither command's level, so a leak shows
    try:
        assert main(argv) == 2
        assert logger.level == logging.ERROR
    finally:
        logger.setLevel(before)
