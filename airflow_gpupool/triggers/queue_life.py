"""The queue life of one waiting request: how long, the positions it went through, what blocked it.

The trigger keeps it while it waits and sends it with the granted event; the operator
writes it to the task log as one line when the pod phase begins (the worker's log, which
stays, unlike the triggerer's lines). Pure: no I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["QueueLife", "describe_queue_life"]

# Positions kept (the first ones and the latest): a request that waited hours stays one line.
_MAX_POSITIONS = 12


@dataclass
class QueueLife:
    """What a waiter saw, from ``started`` (seconds since the epoch)."""

    started: float
    positions: list[tuple[float, int]] = field(default_factory=list)
    blocked: str = ""
    forecasts: list[tuple[float, str]] = field(default_factory=list)

    def saw(self, position: int | None, reason: str | None, at: float | None = None) -> None:
        """Record a position (kept when it changed) and the latest reason it waited."""
        if reason:
            self.blocked = reason
        if position is None or (self.positions and self.positions[-1][1] == position):
            return
        self.positions.append((round((at if at is not None else time.time()) - self.started, 1), position))
        if len(self.positions) > _MAX_POSITIONS:
            del self.positions[_MAX_POSITIONS // 2]

    def forecast(self, words: str, at: float | None = None) -> None:
        """Record what the forecast said (kept when it changed; the first and the latest few)."""
        if self.forecasts and self.forecasts[-1][1] == words:
            return
        self.forecasts.append((round((at if at is not None else time.time()) - self.started, 1), words))
        if len(self.forecasts) > _MAX_POSITIONS:
            del self.forecasts[_MAX_POSITIONS // 2]

    def describe_forecasts(self) -> str:
        """Say what the forecast said at each point: ``forecast at 0s: ...; at 300s: ...`` (empty: none seen)."""
        said = [f"at {t:g}s: {words}" for t, words in self.forecasts if words != "no forecast yet"]
        return f"the forecast said {'; '.join(said)}" if said else ""

    def to_dict(self, waited_s: float) -> dict[str, Any]:
        """Return primitives only (the trigger event): ``waited_s`` as the ledger measured it."""
        return {
            "waited_s": round(max(waited_s, 0.0), 3),
            "positions": [[t, p] for t, p in self.positions],
            "blocked": self.blocked,
        }


def describe_queue_life(life: dict[str, Any] | None) -> str:
    """Say, in one line, how a granted request waited (from :meth:`QueueLife.to_dict`)."""
    if not life:
        return "granted at once, without waiting"
    positions = life.get("positions") or []
    history = " -> ".join(f"{p} at {t:g}s" for t, p in positions) or "none seen"
    blocked = life.get("blocked") or "nothing recorded"
    return f"waited {life.get('waited_s', 0):.1f}s in the queue; positions: {history}; blocked by: {blocked}"
