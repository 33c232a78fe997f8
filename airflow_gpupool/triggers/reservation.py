"""ReservationTrigger: wait, holding no worker slot, until a queued request is granted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from enum import Enum
from typing import Any, cast

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_gpupool.hooks.gpupool import AsyncGpuPoolHook
from airflow_gpupool.ledger.models import ReservationState
from airflow_gpupool.triggers.events import trigger_event


class ReservationEventStatus(str, Enum):
    """The ``status`` of the one event a ReservationTrigger yields."""

    GRANTED = "granted"
    TIMEOUT = "timeout"
    ERROR = "error"


class ReservationTrigger(BaseTrigger):
    """Poll the ledger until reservation ``reservation_id`` is granted, times out or ends.

    Each poll first reaps the ledger (expired leases, overdue requests) so the queue moves
    even when no worker is active. Two copies of the trigger may run at once: both read
    the same reservation and yield the same event, which carries the reservation id.

    :param reservation_id: the queued reservation
    :param ledger_conn_id: the ``gpupool`` connection (None: ``[gpupool]`` configuration)
    :param ledger_url: overrides the connection's ledger URL
    :param poll_interval: seconds between polls
    """

    def __init__(
        self,
        reservation_id: str,
        ledger_conn_id: str | None = AsyncGpuPoolHook.default_conn_name,
        ledger_url: str | None = None,
        poll_interval: float = 5.0,
    ) -> None:
        cast("Callable[[], None]", super().__init__)()  # BaseTrigger.__init__ is not annotated
        self.reservation_id = reservation_id
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return the class path and every constructor argument."""
        return (
            "airflow_gpupool.triggers.reservation.ReservationTrigger",
            {
                "reservation_id": self.reservation_id,
                "ledger_conn_id": self.ledger_conn_id,
                "ledger_url": self.ledger_url,
                "poll_interval": self.poll_interval,
            },
        )

    def _event(self, status: ReservationEventStatus, message: str, **extra: Any) -> TriggerEvent:
        return trigger_event(
            {"status": status.value, "reservation_id": self.reservation_id, "message": message, **extra}
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Yield one event: granted (with the grant), timeout (with what blocked it) or error."""
        hook = AsyncGpuPoolHook(self.ledger_conn_id, ledger_url=self.ledger_url)
        try:
            while True:
                await hook.areap()
                reservation = await hook.aget(self.reservation_id)
                if reservation.state is ReservationState.GRANTED:
                    assert reservation.grant is not None
                    yield self._event(
                        ReservationEventStatus.GRANTED,
                        f"granted on {reservation.grant.node}",
                        grant=reservation.grant.to_dict(),
                    )
                    return
                if reservation.state is ReservationState.TIMED_OUT:
                    yield self._event(ReservationEventStatus.TIMEOUT, reservation.message)
                    return
                if reservation.state.ended:
                    yield self._event(
                        ReservationEventStatus.ERROR,
                        f"reservation ended as {reservation.state.value} while waiting: {reservation.message}",
                    )
                    return
                self.log.info(
                    "Reservation %s waits at position %s of the queue",
                    self.reservation_id,
                    reservation.position,
                )
                await asyncio.sleep(self.poll_interval)
        except Exception as e:  # the trigger contract: failures become an error event
            self.log.exception("Waiting for reservation %s failed", self.reservation_id)
            yield self._event(ReservationEventStatus.ERROR, f"{type(e).__name__}: {e}")
        finally:
            await asyncio.to_thread(hook.close)
