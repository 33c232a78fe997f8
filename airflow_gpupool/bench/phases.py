"""Interleaved bench runs: two ledgers the clients cycle on in turns, so both see the machine alike.

On a shared machine two runs of one tree, one after the other, differ by a factor 1.3 or more;
a ratio of two such runs says little. Runs in phases of a second or two, A B B A over and over,
see the same load over time, and their ratio moves by a few points (`gpupool bench queue
--baseline`, which compares a run with waiters to one without).

Whatever else a run starts (the bench's waiter process) runs through both runs' phases: stopping
it outside its own (SIGSTOP, tried until 2026-12-04) changed what it measured. The waiters then
answered a phase's grants in bursts as the next of their phases began, and with one waiter the
run turned over 51 nodes in 20 s instead of 75: the ratio came out 1.0 where runs without the
pause gave 0.85-0.94.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from airflow_gpupool.ledger import Ledger

__all__ = ["Side", "TurnOver", "run_phases"]

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


def run_phases(
    sides: list[Side], phase: Any, *, seconds: float, phase_s: float, frees_per_s: float
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
    phase.value = -1
    return violations
