"""ReservationTrigger: wait, holding no worker slot, until a queued request is granted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from enum import Enum
from typing import Any, cast

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_gpupool.forecast.deadlines import DagDeadline, deadlines_missed
from airflow_gpupool.forecast.words import clock_time, describe_forecast, describe_position
from airflow_gpupool.hooks.gpupool import AsyncGpuPoolHook
from airflow_gpupool.ledger import LedgerForecasts, Reservation, ReservationState, StartForecast
from airflow_gpupool.triggers.events import trigger_event
from airflow_gpupool.triggers.queue_life import QueueLife
from airflow_gpupool.triggers.wait_room import WaitRoom, wait_room

# A waiter says where it stands this often, and reads its own reservation at its deadline
# (a little after, so the room's reap has ended it).
_LOG_EVERY_S = 60.0
_DEADLINE_SLACK_S = 0.05


class ReservationEventStatus(str, Enum):
    """The ``status`` of the one event a ReservationTrigger yields."""

    GRANTED = "granted"
    TIMEOUT = "timeout"
    #: ``fail_fast_on_forecast``: the forecast's p10 already lies beyond the reservation's timeout.
    FORECAST = "forecast"
    #: The forecast makes one of the DAG run's deadlines unreachable (said once per deadline).
    DEADLINE = "deadline"
    ERROR = "error"


class ReservationTrigger(BaseTrigger):
    """Wait until reservation ``reservation_id`` is granted, times out or ends; only read the ledger.

    The trigger waits in its process's :class:`~airflow_gpupool.triggers.wait_room.WaitRoom`:
    woken by the granting writer's notification (PostgreSQL) or by the room's one batched
    read per ``poll_interval`` for all waiters; then it reads its own reservation. Serving
    the queue is the writers' job (and the controller's reap): a waiter writes only when
    something is overdue (see :meth:`~airflow_gpupool.hooks.gpupool.GpuPoolHook.poll_waiting`).
    Two copies of the trigger may run at once: both read the same reservation and yield the
    same event, which carries the reservation id.

    :param reservation_id: the queued reservation
    :param ledger_conn_id: the ``gpupool`` connection (None: ``[gpupool]`` configuration)
    :param ledger_url: overrides the connection's ledger URL
    :param poll_interval: seconds between the batched reads when no notification can come
    :param fail_fast_on_forecast: give up (a ``forecast`` event, with the forecast in its message)
        as soon as the controller's forecast says the request starts after its timeout even at p10
    :param deadlines: the DAG run's Airflow deadlines (:meth:`DagDeadline.to_dict`): the first
        time the forecast makes one unreachable, a warning is logged and a ``deadline`` event
        (the operator records it and waits again)
    """

    def __init__(
        self,
        reservation_id: str,
        ledger_conn_id: str | None = AsyncGpuPoolHook.default_conn_name,
        ledger_url: str | None = None,
        poll_interval: float = 5.0,
        fail_fast_on_forecast: bool = False,
        deadlines: list[dict[str, Any]] | None = None,
    ) -> None:
        cast("Callable[[], None]", super().__init__)()  # BaseTrigger.__init__ is not annotated
        self.reservation_id = reservation_id
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.poll_interval = poll_interval
        self.fail_fast_on_forecast = fail_fast_on_forecast
        self.deadlines = [DagDeadline.from_dict(d) for d in deadlines or ()]

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return the class path and every constructor argument."""
        return (
            "airflow_gpupool.triggers.reservation.ReservationTrigger",
            {
                "reservation_id": self.reservation_id,
                "ledger_conn_id": self.ledger_conn_id,
                "ledger_url": self.ledger_url,
                "poll_interval": self.poll_interval,
                "fail_fast_on_forecast": self.fail_fast_on_forecast,
                "deadlines": [d.to_dict() for d in self.deadlines],
            },
        )

    def _event(self, status: ReservationEventStatus, message: str, **extra: Any) -> TriggerEvent:
        return trigger_event(
            {"status": status.value, "reservation_id": self.reservation_id, "message": message, **extra}
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Yield one event: granted (with the grant and its queue life), timeout (with what blocked it) or error."""
        hook = AsyncGpuPoolHook(self.ledger_conn_id, ledger_url=self.ledger_url)
        life = QueueLife(time.time())
        try:
            await hook.aoptions()
            room = wait_room(hook.ledger, self.poll_interval)
            read_at = time.monotonic()
            reservation = await hook.apoll_waiting(self.reservation_id)
            while True:
                event = self._settled(reservation, life)
                if event is not None:
                    yield event
                    return
                forecast = await self._log_wait(hook, room, reservation.position, life)
                if self.fail_fast_on_forecast and (hopeless := self._hopeless(reservation, forecast, life)):
                    yield hopeless
                    return
                if missed := self._deadlines_missed(forecast):
                    yield missed
                    return
                own_deadline = reservation.deadline - time.time()
                quiet = min(_LOG_EVERY_S, max(own_deadline, 0.0) + _DEADLINE_SLACK_S)
                woken = await room.wait(self.reservation_id, quiet, since=read_at)
                if woken or time.time() >= reservation.deadline:
                    read_at = time.monotonic()
                    reservation = await hook.apoll_waiting(self.reservation_id)
                else:
                    reservation = replace(
                        reservation, position=room.positions.get(self.reservation_id, reservation.position)
                    )
        except Exception as e:  # the trigger contract: failures become an error event
            self.log.exception("Waiting for reservation %s failed", self.reservation_id)
            yield self._event(ReservationEventStatus.ERROR, f"{type(e).__name__}: {e}")
        finally:
            await asyncio.to_thread(hook.close)

    def _settled(self, reservation: Reservation, life: QueueLife) -> TriggerEvent | None:
        """Return the event of a reservation that stopped waiting, or None while it waits."""
        if reservation.state is ReservationState.GRANTED:
            assert reservation.grant is not None
            return self._event(
                ReservationEventStatus.GRANTED,
                f"granted on {reservation.grant.node}",
                grant=reservation.grant.to_dict(),
                queue_life=life.to_dict(reservation.grant.granted_at - reservation.created_at),
            )
        if reservation.state is ReservationState.TIMED_OUT:
            said = life.describe_forecasts()
            message = f"{reservation.message}; {said}" if said else reservation.message
            return self._event(ReservationEventStatus.TIMEOUT, message)
        if reservation.state.ended:
            return self._event(
                ReservationEventStatus.ERROR,
                f"reservation ended as {reservation.state.value} while waiting: {reservation.message}",
            )
        return None

    def _hopeless(
        self, reservation: Reservation, forecast: StartForecast | None, life: QueueLife
    ) -> TriggerEvent | None:
        """Return a ``forecast`` event when even the forecast's p10 lies beyond the reservation's deadline."""
        never = forecast is not None and forecast.status == "never"
        late = forecast is not None and forecast.p10 is not None and forecast.p10 > reservation.deadline
        if not (never or late):
            return None
        due = clock_time(reservation.deadline, time.time())
        return self._event(
            ReservationEventStatus.FORECAST,
            f"gave up before its reservation timeout ({due} UTC): {life.describe_forecasts()}",
        )

    def _deadlines_missed(self, forecast: StartForecast | None) -> TriggerEvent | None:
        """Return a ``deadline`` event when the forecast makes a deadline not yet warned of unreachable."""
        missed = deadlines_missed(self.deadlines, forecast, time.time())
        if missed is None:
            return None
        for words in missed.new:
            self.log.warning("Reservation %s %s", self.reservation_id, words)
        return self._event(ReservationEventStatus.DEADLINE, missed.message, **missed.fields())

    async def _log_wait(
        self, hook: AsyncGpuPoolHook, room: WaitRoom, position: int | None, life: QueueLife
    ) -> StartForecast | None:
        """Log where the request stands, why it waits (the reason a few times a second per room) and its forecast."""
        reason = await hook.aexplain(self.reservation_id) if room.may_explain() else None
        life.saw(position, reason)
        forecast = room.forecasts.get(self.reservation_id)
        if forecast is None and reason is not None:  # explained this time: the same budget reads it
            forecast = await asyncio.to_thread(LedgerForecasts(hook.ledger).get, self.reservation_id)
        now = time.time()
        total = len(room.positions) or (forecast.queue_length if forecast else None)
        life.forecast(describe_forecast(forecast, now), now)
        self.log.info(
            "Reservation %s waits at %s: %s",
            self.reservation_id,
            describe_position(position, total, forecast, now),
            reason or life.blocked or "no explanation yet (many requests wait in this triggerer)",
        )
        return forecast
