"""``make ui``'s supervisor stops every process it started, children included, within 10 s (issue 37).

``airflow standalone`` with the emulator, agents and controller is too heavy to start in a test
on two cores, so the supervisor runs stand-in services shaped like them: one ignores SIGTERM and
has a child in a process group of its own (Airflow's task runner does that), one stops politely,
one leaves behind an orphan in a session of its own; a one-off step and a readiness wait come
first, as the emulator's kubeconfig and the inventory sync do. The test sends what a terminal and
``kill`` send and checks every recorded process is gone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.skips import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
LIMIT_SECONDS = 10.0

# Each stand-in writes "<pid>\n" lines to pids/<name> for itself and every process it starts.
STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    process_group=0,  # a group of its own, as Airflow's task runner gives a task
)
open(sys.argv[1], "w").write(f"{os.getpid()}\\n{child.pid}\\n")
time.sleep(600)
"""
POLITE = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(f"{os.getpid()}\\n{child.pid}\\n")
time.sleep(600)
"""
ESCAPEE = """
import os, subprocess, sys, time
# The middle process starts a grandchild in a new session and exits: the grandchild is an orphan.
middle = subprocess.run(
    [sys.executable, "-c", "import subprocess, sys; "
     "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True, "
     "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
     "print(p.pid)"],
    capture_output=True, text=True, check=True,
)
open(sys.argv[1], "w").write(f"{os.getpid()}\\n{middle.stdout.strip()}\\n")
time.sleep(600)
"""
CRASHER = """
import sys, time
from pathlib import Path
while not Path(sys.argv[1]).is_file():  # the test says when, once it has seen everything start
    time.sleep(0.05)
raise SystemExit(3)
"""
DRIVER = """
import sys
from pathlib import Path

from airflow_gpupool.demo.supervise import Service, Supervisor

work = Path(sys.argv[1])
py = sys.executable
with Supervisor(grace=float(sys.argv[2])) as supervisor:
    emulator = "import os, time; open('pids/emulator', 'w').write(str(os.getpid())); open('ready', 'w').write('x'); time.sleep(600)"
    supervisor.start(Service("emulator", [py, "-c", emulator]))
    supervisor.wait_until(lambda: Path("ready").is_file(), timeout=30, what="the stand-in emulator")
    supervisor.run(Service("sync", [py, "-c", "pass"]))
    for name in ("stubborn", "polite", "escapee"):
        supervisor.start(Service(name, [py, str(work / f"{name}.py"), str(work / "pids" / name)]))
    if sys.argv[3:] == ["crash"]:  # a service that dies on its own once the others have started theirs
        supervisor.start(Service("crasher", [py, str(work / "crasher.py"), str(work / "go")]))
    sys.exit(supervisor.watch())
"""


def _write(work: Path) -> None:
    (work / "pids").mkdir()
    for name, code in {
        "stubborn": STUBBORN,
        "polite": POLITE,
        "escapee": ESCAPEE,
        "crasher": CRASHER,
        "driver": DRIVER,
    }.items():
        (work / f"{name}.py").write_text(textwrap.dedent(code))


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _live(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"  # a zombie runs nothing


def _recorded(work: Path) -> list[int]:
    return [int(p) for f in (work / "pids").iterdir() for p in f.read_text().split()]


@pytest.fixture
def proc() -> None:
    """The supervisor and these tests read /proc to see every process: skip without it, fail under CI."""
    if not Path("/proc").is_dir():
        skip_or_fail("no /proc here (Linux only)", what="the make ui supervisor tests")


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    """The stand-ins' folder; whatever they left running when a test failed is killed after it."""
    _write(tmp_path)
    yield tmp_path
    for pid in _recorded(tmp_path):
        if _live(pid):
            os.kill(pid, signal.SIGKILL)


def _started(work: Path, supervisor: subprocess.Popen[bytes]) -> list[int]:
    deadline = time.monotonic() + 30
    files = [work / "pids" / name for name in ("stubborn", "polite", "escapee")]
    while not all(f.is_file() and len(f.read_text().split()) == 2 for f in files):
        if supervisor.poll() is not None or time.monotonic() > deadline:
            os.killpg(supervisor.pid, signal.SIGKILL)
            pytest.fail(f"the stand-ins did not start (supervisor status {supervisor.poll()})")
        time.sleep(0.1)
    (work / "pids" / "supervisor").write_text(str(supervisor.pid))  # for the fixture's clean-up
    pids = _recorded(work)
    assert all(_live(p) for p in pids)
    return pids


def _assert_all_gone_in_time(pids: list[int], supervisor: subprocess.Popen[bytes], sent: float) -> None:
    supervisor.wait(timeout=LIMIT_SECONDS + 5)
    while any(_live(p) for p in pids) and time.monotonic() - sent < LIMIT_SECONDS:
        time.sleep(0.05)
    elapsed = time.monotonic() - sent
    left = [p for p in pids if _live(p)]
    for pid in left:  # do not leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"still running {elapsed:.1f} s after the signal: {left}"
    assert elapsed < LIMIT_SECONDS


@pytest.mark.usefixtures("proc")
@pytest.mark.parametrize(
    ("signum", "to_group", "status"),
    [
        pytest.param(signal.SIGINT, True, 130, id="ctrl-c-to-the-foreground-group"),
        pytest.param(signal.SIGTERM, False, 143, id="sigterm-to-the-supervisor"),
    ],
)
def test_a_signal_stops_every_process_within_ten_seconds(
    work: Path, signum: int, to_group: bool, status: int
) -> None:
    supervisor = subprocess.Popen(
        [sys.executable, str(work / "driver.py"), str(work), "5"],
        cwd=work,
        env=_env(),
        start_new_session=True,  # a group of its own, like the foreground job of a terminal
    )
    pids = _started(work, supervisor)
    sent = time.monotonic()
    if to_group:
        os.killpg(supervisor.pid, signum)  # what Ctrl-C does: the whole foreground group
    else:
        os.kill(supervisor.pid, signum)
    _assert_all_gone_in_time(pids, supervisor, sent)
    assert supervisor.returncode == status


def _ui_recipe_launch_line() -> str:
    """Return the last line of the Makefile's ``ui`` recipe: the one that starts the supervisor."""
    recipe = re.search(r"^ui:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), flags=re.M)
    assert recipe is not None, "no ui target in the Makefile"
    return recipe.group(1).splitlines()[-1]


@pytest.mark.usefixtures("proc")
def test_sigterm_to_make_reaches_the_supervisor(work: Path) -> None:
    # make forwards SIGTERM to its child: the Makefile's launch line must make that child the
    # supervisor itself (`exec`), not a shell that would die and leave the supervisor running.
    line = _ui_recipe_launch_line()
    launch = re.sub(
        r"\$\(BIN\)/python -m airflow_gpupool\.demo\.ui .*$", f"{sys.executable} driver.py {work} 5", line
    )
    assert launch != line, f"the ui recipe no longer starts airflow_gpupool.demo.ui: {line!r}"
    # UI_ENV as the real one is: a JSON connection in single quotes.
    (work / "Makefile").write_text(f"UI_ENV := GPUPOOL_X='{{\"a\": 1}}' GPUPOOL_Y=2\nui:\n{launch}\n")
    make = subprocess.Popen(["make", "-s", "ui"], cwd=work, env=_env(), start_new_session=True)
    pids = _started(work, make)
    sent = time.monotonic()
    os.kill(make.pid, signal.SIGTERM)
    _assert_all_gone_in_time(pids, make, sent)
    assert make.returncode != 0


@pytest.mark.usefixtures("proc")
def test_a_service_that_ends_stops_the_others_with_its_status(work: Path) -> None:
    supervisor = subprocess.Popen(
        [sys.executable, str(work / "driver.py"), str(work), "5", "crash"],
        cwd=work,
        env=_env(),
        start_new_session=True,
    )
    pids = _started(work, supervisor)
    (work / "go").touch()
    _assert_all_gone_in_time(pids, supervisor, time.monotonic())
    assert supervisor.returncode == 3
