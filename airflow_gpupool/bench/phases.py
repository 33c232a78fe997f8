"""Interleaved bench runs: two ledgers the clients cycle on in turns, so both see the machine alike.

On a shared machine two runs of one tree, one after the other, differ by a factor 1.3 or more;
a ratio of two such runs says little. Runs in phases of a second or two, A B B A over and over,
see the same load over time, and their ratio moves by a few points (`gpupool bench queue
--baseline`, which compares a run with waiters to one without).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

from airflow_gpupool.ledger import Ledger

__all__ = ["Pause", "Side", "TurnOver", "run_phases"]

#: Frees a whole node of the ledger (from the fillers, or a node granted before): False if none is left.
TurnOver = Callable[[Ledger, dict[str, list[str]], list[str]], bool]


class Side:
    """One ledger the clients cycle on, and the bench's node turnover there."""

    def __init__(self, ledger: Ledger, fillers: dict[str, list[str]], turn_over: TurnOver) -> None:
        self.ledger = ledger
        self.fillers = fillers
        self.granted_nodes: list[str] = []
        self._turn = turn_over
        #: Seconds measured on this side so far; nodes turned over meanwhile.
        self.spent = 0.0
        self.turned_over = 0

    def turn_over(self) -> bool:
        return self._turn(self.ledger, self.fillers, self.granted_nodes)


def phases(sides: int) -> Iterator[tuple[int, bool]]:
    """The runs' turns, and whether each is measured. One run: one phase. Two: one unmeasured
    phase each first (the clients' connections, plans and caches warm up on both), then A B B A
    over and over, so a trend in the machine's speed falls on both runs alike (with A B A B, the
    run that goes first in each pair ran 2-5 % slower in runs without waiters on both sides)."""
    if sides == 1:
        yield 0, True
        return
    yield 0, False
    yield 1, False
    while True:
        yield from ((0, True), (1, True), (1, True), (0, True))


class Pause:
    """Stops the waiter process outside its run's phases (interleaved runs only), so all its work
    counts there; counts the seconds it was stopped."""

    def __init__(self, pid: int | None) -> None:
        self._pid = pid
        self._stopped = False
        self.stopped_s = 0.0

    def run_only(self, running: bool) -> None:
        if self._pid is not None:
            os.kill(self._pid, signal.SIGCONT if running else signal.SIGSTOP)
            self._stopped = not running

    def count(self, seconds: float) -> None:
        self.stopped_s += seconds * self._stopped


def run_phases(
    sides: list[Side], phase: Any, pause: Pause, *, seconds: float, phase_s: float, frees_per_s: float
) -> list[str]:
    """Let the clients cycle on each side in its turns (``seconds`` each in all), turning nodes
    over there meanwhile; return the invariant violations seen once a second."""
    violations: list[str] = []
    next_check = time.time()
    for turn, measured in phases(len(sides)):
        side = sides[turn]
        if min(other.spent for other in sides) >= seconds:
            break
        if measured and side.spent >= seconds:
            continue
        pause.run_only(turn == 0)
        phase.value = turn if measured else turn + len(sides)
        began = time.time()
        end = began + min(phase_s if len(sides) > 1 else seconds, seconds - side.spent)
        while (now := time.time()) < end:
            turned = side.turn_over()
            side.turned_over += turned and measured
            if now >= next_check:
                violations += side.ledger.check_invariants()
                next_check += 1.0
            time.sleep(max(0.0, min(1.0 / frees_per_s, end - time.time())))
        side.spent += (time.time() - began) * measured
        pause.count(time.time() - began)
    phase.value = -1
    pause.run_only(True)
    return violations
