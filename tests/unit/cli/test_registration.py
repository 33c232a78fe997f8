"""The ``gpupool`` command registers every subcommand, and one without its optional extra says which to install."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_gpupool.cli import build_parser, main
from airflow_gpupool.cli.common import require_extra
from airflow_gpupool.exceptions import GpuPoolError

COMMANDS = {
    "ledger": ["init"],
    "inventory": ["load", "sync"],
    "status": [],
    "reserve": [],
    "explain": [],
    "chain": [],
    "release": [],
    "reap": [],
    "bench": ["ledger", "queue", "operator", "heartbeats", "forecast", "ui"],
    "simulate": [],
    "traces": ["fetch", "synth"],
    "emulator": [],
    "reconcile": [],
    "controller": ["run"],
    "metrics": ["serve"],
    "quota": ["apply", "list"],
    "agent": ["run"],
    "node": ["quarantine", "release"],
}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def test_every_command_and_action_is_registered_in_order() -> None:
    top = _subcommands(build_parser())
    assert list(top) == list(COMMANDS)
    assert {name: list(_subcommands(p)) for name, p in top.items()} == COMMANDS


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    # Command lines are indented by four; a help text that wraps continues further in.
    listed = [m[1] for m in re.finditer(r"^    (\S+)", capsys.readouterr().out, re.MULTILINE)]
    assert listed == list(COMMANDS)


def test_help_needs_no_optional_extra() -> None:
    # A fresh interpreter in which kmock and matplotlib cannot be imported, as without the extras.
    code = textwrap.dedent(
        """
        import sys
        sys.modules["kmock"] = None
        sys.modules["matplotlib"] = None
        from airflow_gpupool.cli import main
        main(["--help"])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "emulator" in done.stdout and "simulate" in done.stdout


@pytest.mark.parametrize(
    ("argv", "package", "extra"),
    [
        pytest.param(["emulator", "--kubeconfig", "kc"], "kmock", "testing", id="emulator"),
        pytest.param(["bench", "operator", "--tasks", "1"], "kmock", "testing", id="bench-operator"),
        pytest.param(["simulate", "--plot", "out.png", "--quiet"], "matplotlib", "plot", id="simulate-plot"),
    ],
)
def test_missing_extra_exits_2_naming_the_extra(
    argv: list[str],
    package: str,
    extra: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # `import <package>` now fails as if not installed
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert f"pip install 'airflow-gpupool[{extra}]'" in captured.err
    assert package in captured.err
    assert captured.out == ""


def test_require_extra_passes_an_installed_package() -> None:
    require_extra("json", "none", "gpupool test")


def test_require_extra_does_not_hide_an_error_inside_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "gpupool_broken_extra.py").write_text("import gpupool_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as caught:
        require_extra("gpupool_broken_extra", "testing", "gpupool test")
    assert caught.value.name == "gpupool_no_such_dependency"


def test_require_extra_names_the_command_and_the_pip_line() -> None:
    with pytest.raises(GpuPoolError, match=r"gpupool x needs gpupool_absent_pkg, .*'t' extra.*\[t\]'"):
        require_extra("gpupool_absent_pkg", "t", "gpupool x")


def test_emulator_options_match_the_stand_alone_parser() -> None:
    from airflow_gpupool.testing.emulator import DESCRIPTION
    from airflow_gpupool.testing.emulator import build_parser as emulator_parser

    ours = _subcommands(build_parser())["emulator"]

    def options(parser: argparse.ArgumentParser) -> list[tuple[object, ...]]:
        return [
            (tuple(a.option_strings), a.dest, a.default, a.type, a.required, a.help)
            for a in parser._actions
            if not isinstance(a, argparse._HelpAction)
        ]

    assert options(ours) == options(emulator_parser())
    assert ours.description == DESCRIPTION
