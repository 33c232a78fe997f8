"""The documentation builds strictly, its reference pages come from the code, its runnable blocks run.

``make docs`` and these tests run the same ``sphinx-build -E -W -n``: a warning (a broken internal
link or anchor, a missing cross-reference, a page outside every toctree) fails the build. A block
marked ``:class: runnable`` (a MyST ``{code-block} python`` or ``bash``) is executed as written, in
an empty folder, with a temporary ``AIRFLOW_HOME``.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
BUILD_BUDGET_S = 60

RUNNABLE = re.compile(r"```\{code-block\} (\w+)\n((?::[\w-]+:[^\n]*\n)+)\n(.*?)\n```", re.S)


def sphinx_build(src: Path, out: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """Build ``src`` as ``make docs`` does; return the process and its wall time."""
    started = time.monotonic()
    done = subprocess.run(
        [str(BIN / "sphinx-build"), "-E", "-W", "--keep-going", "-n", "-q", "-b", "html", str(src), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done, time.monotonic() - started


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs-html")
    done, took = sphinx_build(DOCS, out)
    assert done.returncode == 0, f"the strict docs build failed:\n{done.stdout}\n{done.stderr}"
    assert took < BUILD_BUDGET_S, f"the docs build took {took:.1f} s, over its {BUILD_BUDGET_S} s budget"
    return out


def page_text(site: Path, name: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", (site / name).read_text()))


def test_every_page_is_built(site: Path) -> None:
    sources = {
        p.relative_to(DOCS).with_suffix(".html") for p in DOCS.rglob("*.md") if "_build" not in p.parts
    }
    assert sources <= {p.relative_to(site) for p in site.rglob("*.html")}


def test_a_broken_internal_link_fails_the_build(tmp_path: Path) -> None:
    # The same configuration on a one-page site whose only link names a missing page.
    src = tmp_path / "docs"
    src.mkdir()
    shutil.copy(DOCS / "conf.py", src / "conf.py")
    shutil.copytree(DOCS / "_ext", src / "_ext", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "index.md").write_text("# Home\n\nSee [the page](no-such-page.md).\n")
    done, _ = sphinx_build(src, tmp_path / "html")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr and "myst.xref_missing" in done.stderr


def test_the_cli_reference_lists_every_command_with_its_options(site: Path) -> None:
    import argparse

    from airflow_gpupool.cli import build_parser

    text = page_text(site, "reference/cli.html")

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        assert f"usage: {path}" in text, path
        for action in parser._actions:
            for flag in action.option_strings if action.help != argparse.SUPPRESS else ():
                assert flag in text, f"{path} {flag}"
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")

    walk(build_parser(), "gpupool")


def test_the_configuration_reference_is_get_provider_info(site: Path) -> None:
    from airflow_gpupool.get_provider_info import get_provider_info

    text = page_text(site, "reference/configuration.html")
    options = get_provider_info()["config"]["gpupool"]["options"]
    assert len(options) > 30
    for name, option in options.items():
        assert name in text
        words = " ".join(option["description"].replace("`", "").split())  # code spans lose their backticks
        assert words[:60] in " ".join(text.split()), name


def test_the_metrics_reference_names_every_metric(site: Path) -> None:
    from airflow_gpupool.metrics import (
        DRIFT_METRIC_NAMES,
        FORECAST_METRIC_NAMES,
        METRIC_NAMES,
        PREEMPTION_METRIC_NAMES,
        QUOTA_METRIC_NAMES,
    )
    from airflow_gpupool.metrics.agent import AGENT_METRIC_NAMES

    text = page_text(site, "reference/metrics.html")
    names = {
        *METRIC_NAMES,
        *QUOTA_METRIC_NAMES,
        *PREEMPTION_METRIC_NAMES,
        *DRIFT_METRIC_NAMES,
        *FORECAST_METRIC_NAMES,
        *AGENT_METRIC_NAMES,
    }
    listed = set(re.findall(r"\bgpupool_[a-z_]+\b", text))
    assert names <= listed
    # Nothing listed that the collectors do not yield (the page's prose names none).
    assert listed <= names | {f"{n}_total" for n in names} | {"gpupool_quota_"}


def test_the_operations_page_explains_only_metrics_that_exist(site: Path) -> None:
    text = page_text(site, "reference/metrics.html")
    ops = (DOCS / "operations.md").read_text()
    table = ops[ops.index("| metric | type |") : ops.index("The counters and the histogram")]
    for name in re.findall(r"`(gpupool_[a-z_]+)", table):
        if name.endswith("_"):  # a family written with braces: gpupool_gpu_{capacity,...}_milli
            continue
        assert name in text, name


def runnable_blocks() -> list[tuple[str, str, str]]:
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        for language, options, code in RUNNABLE.findall(page.read_text()):
            if ":class: runnable" in options:
                found.append((f"{page.relative_to(DOCS)}:{language}:{len(found)}", language, code))
    return found


BLOCKS = runnable_blocks()


def test_the_runnable_blocks_are_found() -> None:
    # A changed marker or pattern would silently run nothing: these are the blocks marked today.
    assert len(BLOCKS) >= 6
    assert {language for _, language, _ in BLOCKS} == {"python", "bash"}


@pytest.mark.parametrize(("where", "language", "code"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_a_runnable_block_runs(where: str, language: str, code: str, tmp_path: Path) -> None:
    shutil.copy(ROOT / "examples" / "inventory.yaml", tmp_path / "inventory.yaml")
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "GPUPOOL_CHECKPOINT_DIR": (tmp_path / "checkpoints").as_uri(),
    }
    env.pop("GPUPOOL_LEDGER_URL", None)
    env.pop("AIRFLOW_CONN_GPUPOOL_DEFAULT", None)
    command = (
        [sys.executable, "-c", code] if language == "python" else ["bash", "-euo", "pipefail", "-c", code]
    )
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, (
        f"{where} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


def test_the_readme_is_a_front_door_whose_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    # `make demo` and `make test` stay the README's first two commands.
    first_block = re.search(r"```bash\n(.*?)```", readme, flags=re.S)
    assert first_block is not None
    assert [line.split()[:2] for line in first_block.group(1).splitlines()[:2]] == [
        ["make", "demo"],
        ["make", "test"],
    ]
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert len(local) >= 15
    for link in local:
        assert (ROOT / link).exists(), link
