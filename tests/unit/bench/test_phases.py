"""The interleaved bench's turns: both runs warm up unmeasured, then share time in A B B A order."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import time

from airflow_gpupool.bench.phases import Pause, phases


def test_one_run_is_one_measured_phase() -> None:
    assert list(phases(1)) == [(0, True)]


def test_two_runs_warm_up_unmeasured_then_alternate_a_b_b_a() -> None:
    turns = list(itertools.islice(phases(2), 10))
    assert turns[:2] == [(0, False), (1, False)]
    assert [turn for turn, measured in turns[2:]] == [0, 1, 1, 0, 0, 1, 1, 0]
    assert all(measured for _, measured in turns[2:])


def test_pause_stops_the_process_outside_its_turns_and_counts_the_time() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pause = Pause(child.pid)
        pause.run_only(False)
        assert _settled_state(child.pid, {"T"}) == "T"  # stopped
        pause.count(1.5)
        pause.run_only(True)
        assert _settled_state(child.pid, {"S", "R"}) in {"S", "R"}
        pause.count(2.0)  # running: not counted
        assert pause.stopped_s == 1.5
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def test_pause_without_a_process_does_nothing() -> None:
    pause = Pause(None)
    pause.run_only(False)
    pause.count(3.0)
    assert pause.stopped_s == 0.0


def _settled_state(pid: int, wanted: set[str]) -> str:
    """The process's state letter from /proc, once it is one of ``wanted`` (a signal is delivered
    asynchronously) or after 5 s."""
    deadline = time.monotonic() + 5
    while True:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
        if state in wanted or time.monotonic() > deadline:
            return state
        time.sleep(0.01)
