"""The waiters of one ledger in one event loop: one batched read per poll, one listening connection.

A triggerer may run thousands of :class:`~airflow_gpupool.triggers.reservation.ReservationTrigger`
at once. Were each to read its reservation every few seconds, the reads would grow with the
queue; here they wait in one room per (event loop, ledger), which

* on PostgreSQL listens on one connection for the ids of settled requests (the writer that
  grants or ends a queued request notifies at commit, :mod:`airflow_gpupool.ledger.postgres.notify`)
  and wakes exactly the waiters of those ids;
* reads, in one query per poll for all its waiters, the queue's order: who no longer waits
  (woken) and where the others stand (:attr:`WaitRoom.positions`, with the forecasts the
  controller stored, :attr:`WaitRoom.forecasts`) (every
  ``poll_interval`` without a listener, every ``[gpupool] wait_fallback_poll_seconds`` with
  one, in case a notification was lost), and wakes them;
* checks once per ``[gpupool] waiter_reap_interval_seconds`` whether anything is overdue
  (:meth:`~airflow_gpupool.ledger.Ledger.reap_if_due`), which is what heals a pool that no
  controller reaps.

It only reads, except for that reap when something is due. A woken waiter reads its own
reservation; the room's task ends with its last waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import weakref
from typing import TYPE_CHECKING

from airflow_gpupool import settings
from airflow_gpupool.ledger import GrantListener, LedgerForecasts

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger, StartForecast

__all__ = ["WaitRoom", "wait_room"]

log = logging.getLogger(__name__)

# How often a room without a working listener tries to open one again.
_LISTEN_RETRY_S = 30.0
# At most this many waiters per second of one room explain why they wait (an explanation
# places the request on the whole inventory): the others log their position only.
_EXPLANATIONS_PER_S = 5.0
# How long the room remembers a settled id for a waiter that was not in the room when it settled.
_SETTLED_MEMORY_S = 300.0

_rooms: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, WaitRoom]] = (
    weakref.WeakKeyDictionary()
)


def wait_room(ledger: Ledger, poll_interval: float) -> WaitRoom:
    """Return the room of ``ledger`` in the running event loop, made on first use.

    :param poll_interval: the most a waiter of this room wants between batched reads
    """
    loop = asyncio.get_running_loop()
    rooms = _rooms.setdefault(loop, {})
    room = rooms.get(id(ledger))
    if room is None or room.ledger is not ledger:
        room = rooms[id(ledger)] = WaitRoom(ledger, poll_interval)
    room.poll_interval = min(room.poll_interval, poll_interval)
    return room


class WaitRoom:
    """Waiters of one ledger, woken by notification or by one batched read.

    :param ledger: the process's shared ledger
    :param poll_interval: seconds between batched reads when nothing listens
    :param listen: listen for notifications (PostgreSQL, not through a transaction pooler)
    """

    def __init__(self, ledger: Ledger, poll_interval: float, *, listen: bool | None = None) -> None:
        self.ledger = ledger
        self.poll_interval = poll_interval
        if listen is None:
            listen = ledger.dialect == "postgresql" and ledger.listener_budget > 0
        self._listen = listen
        self._events: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._listening = False
        self._listen_failed_at = -_LISTEN_RETRY_S
        self._explained_at = 0.0
        self._polled_at = time.monotonic()
        #: Where each waiting request stood at the last batched read (1: next in line).
        self.positions: dict[str, int] = {}
        #: Each waiting request's stored forecast, read with the positions (the controller writes them).
        self.forecasts: dict[str, StartForecast] = {}
        #: How many waiters the room woke, by cause (tests and the bench read it).
        self.woken = {"notify": 0, "poll": 0, "forecast": 0}
        # When each id was seen settled (notified, or missing from a batched read): a waiter that
        # read its request before then, and entered the room after, would else sleep through it.
        self._settled_at: dict[str, float] = {}

    @property
    def listening(self) -> bool:
        """Whether the room's listener connection is up."""
        return self._listening

    def __len__(self) -> int:
        return len(self._events)

    async def wait(self, reservation_id: str, timeout: float, *, since: float | None = None) -> bool:
        """Wait until ``reservation_id`` may have stopped waiting, at most ``timeout`` seconds.

        :param since: when (``time.monotonic()``) the caller began its last read of the request: a
            settlement the room saw after that returns at once, though the caller was not yet waiting
        :returns: True when woken (read the reservation now), False on the timeout
        """
        if since is not None and self._settled_at.get(reservation_id, -math.inf) >= since:
            return True
        event = asyncio.Event()
        self._events.setdefault(reservation_id, set()).add(event)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="gpupool wait room")
        try:
            await asyncio.wait_for(event.wait(), max(0.0, timeout))
            return True
        except TimeoutError:
            return False
        finally:
            waiting = self._events.get(reservation_id)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._events[reservation_id]

    def may_explain(self) -> bool:
        """Whether a waiter may ask why it waits now (a few per second per room)."""
        now = time.monotonic()
        if now - self._explained_at < 1.0 / _EXPLANATIONS_PER_S:
            return False
        self._explained_at = now
        return True

    def wake(self, reservation_ids: list[str] | set[str], cause: str) -> None:
        """Wake the waiters of ``reservation_ids``."""
        if cause != "forecast":
            self._remember_settled(reservation_ids)
        for rid in reservation_ids:
            for event in self._events.get(rid, ()):
                if not event.is_set():
                    event.set()
                    self.woken[cause] += 1

    def _remember_settled(self, reservation_ids: list[str] | set[str]) -> None:
        now = time.monotonic()
        oldest = next(iter(self._settled_at.values()), now)
        if now - oldest > _SETTLED_MEMORY_S:  # ordered oldest first: forget the old ones
            self._settled_at = {
                rid: at for rid, at in self._settled_at.items() if now - at <= _SETTLED_MEMORY_S
            }
        for rid in reservation_ids:
            self._settled_at.pop(rid, None)  # re-inserted last: the oldest stay first
            self._settled_at[rid] = now

    async def _run(self) -> None:
        listener: asyncio.Task[None] | None = None
        try:
            while self._events:
                if self._listen and listener is None and self._may_retry_listen():
                    listener = asyncio.get_running_loop().create_task(self._listen_loop())
                    await asyncio.sleep(0)  # let it connect before the first interval is chosen
                if listener is not None and listener.done():
                    listener = None
                quiet = settings.wait_fallback_poll_seconds() if self._listening else self.poll_interval
                reap_every = settings.waiter_reap_interval_seconds()
                await asyncio.sleep(min(quiet, reap_every))
                reaped = await self._reap_if_due(reap_every)
                if reaped or time.monotonic() - self._polled_at >= quiet:
                    await self._poll()
        finally:
            if listener is not None:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await listener

    def _may_retry_listen(self) -> bool:
        return time.monotonic() - self._listen_failed_at >= _LISTEN_RETRY_S

    async def _reap_if_due(self, interval: float) -> bool:
        try:
            return await asyncio.to_thread(self.ledger.reap_if_due, interval) is not None
        except Exception:  # a busy or unreachable ledger: the next check tries again
            log.warning("Checking the ledger for overdue leases and waits failed", exc_info=True)
            return False

    async def _poll(self) -> None:
        self._polled_at = time.monotonic()
        ids = list(self._events)
        if not ids:
            return
        before = self.forecasts
        try:
            self.positions = await asyncio.to_thread(self.ledger.queue_positions)
            self.forecasts = await asyncio.to_thread(LedgerForecasts(self.ledger).get_many)
        except Exception:  # the waiters' own reads report the error; the room tries again
            log.warning("Reading the waiting requests failed; trying again", exc_info=True)
            return
        self.wake(set(ids) - self.positions.keys(), "poll")
        # A new forecast may make a DAG deadline unreachable: its waiter says so now, not at its next line.
        self.wake({rid for rid in ids if self.forecasts.get(rid) != before.get(rid)}, "forecast")

    async def _listen_loop(self) -> None:
        listener = GrantListener(self.ledger.url)
        try:
            await listener.open()
            self._listening = True
            # Settled between the waiters' last read and LISTEN: one batched read catches them.
            await self._poll()
            async for ids in listener.ids():
                self.wake(ids, "notify")
        except asyncio.CancelledError:
            raise
        except Exception:
            self._listen_failed_at = time.monotonic()
            log.warning("Listening for grants failed; the waiters poll instead", exc_info=True)
        finally:
            self._listening = False
            await listener.close()
