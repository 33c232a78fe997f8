"""LeasedTrigger: what the leased pod and Job triggers share (lease arguments, renewal, the race).

Each wraps a cncf.kubernetes trigger and renews a grant's lease beside it; they differ only in
what they renew (one grant or a gang), what they delete when the lease is lost, and how they
follow the wrapped trigger's events.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, ClassVar, Self

from airflow.triggers.base import BaseTrigger

from airflow_gpupool.hooks.gpupool import AsyncGpuPoolHook
from airflow_gpupool.ledger import ReservationState
from airflow_gpupool.triggers.lease import LeaseWatch

if TYPE_CHECKING:
    from airflow_gpupool.exceptions import LeaseLostError

__all__ = ["LeasedTrigger", "cancel_quietly"]

# How long a wrapped trigger's failure waits for the renewer to say the lease was lost.
_WORKLOAD_DELETED_S = 10.0


def _failed(future: asyncio.Future[Any]) -> bool:
    """Whether ``future`` ended with an error (its trigger running out of events is none)."""
    if not future.done() or future.cancelled():
        return False
    error = future.exception()
    return error is not None and not isinstance(error, StopAsyncIteration)


async def cancel_quietly(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` (if any) and wait for it to end, ignoring its cancellation or exhaustion."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
        await task


class LeasedTrigger(BaseTrigger):
    """Mix the lease into a cncf.kubernetes trigger: put it first among the bases.

    :param reservation_id: the grant (or the gang's leader) the workload runs on
    :param ledger_conn_id: the ``gpupool`` connection (None: ``[gpupool]`` configuration)
    :param ledger_url: overrides the connection's ledger URL
    :param lease_ttl: the lease length to renew to, in seconds
    """

    #: The dotted path :meth:`serialize` stores: the triggerer imports the trigger from it.
    classpath: ClassVar[str]

    def __init__(
        self,
        *args: Any,
        reservation_id: str,
        ledger_conn_id: str | None = AsyncGpuPoolHook.default_conn_name,
        ledger_url: str | None = None,
        lease_ttl: float = 600.0,
        **kwargs: Any,
    ) -> None:
        # super() here is the wrapped cncf.kubernetes trigger, next in the subclass's MRO, not BaseTrigger.
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self.reservation_id = reservation_id
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.lease_ttl = lease_ttl

    @classmethod
    def wrap(cls, trigger: BaseTrigger, **lease: Any) -> Self:
        """Return this trigger with ``trigger``'s arguments plus the lease's."""
        _, kwargs = trigger.serialize()
        return cls(**kwargs, **lease)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return the class path, the wrapped trigger's arguments and the lease's."""
        _, kwargs = super().serialize()  # type: ignore[safe-super]  # the wrapped trigger's
        kwargs.update(
            reservation_id=self.reservation_id,
            ledger_conn_id=self.ledger_conn_id,
            ledger_url=self.ledger_url,
            lease_ttl=self.lease_ttl,
        )
        return self.classpath, kwargs

    async def _renew(self, hook: AsyncGpuPoolHook) -> None:
        """Renew the lease once (raises what the ledger raises)."""
        raise NotImplementedError

    async def _lease_lost(self, lost: LeaseLostError) -> dict[str, Any]:
        """Delete the workload the lost lease no longer covers; return the lease-lost event."""
        raise NotImplementedError

    async def _workload_ended(self) -> bool:
        """Whether the workload has ended by itself (asked when the lease is lost; default: not known)."""
        return False

    async def _renew_until_lost(self) -> dict[str, Any]:
        """Renew every ``ttl / 3`` (at once when the grant is being preempted); return
        :meth:`_lease_lost`'s event once the lease is lost."""
        hook = AsyncGpuPoolHook(self.ledger_conn_id, ledger_url=self.ledger_url)
        watch = LeaseWatch(self.reservation_id, self.lease_ttl)
        first = True
        try:
            while True:
                if not (first or watch.renewal_due() or await self._preempting(hook)):
                    await asyncio.sleep(watch.look_interval)
                    continue
                first = False
                try:
                    await self._renew(hook)
                except Exception as e:
                    lost = watch.failed(e)
                    if lost is not None and await self._ended_first(lost):
                        # Nothing was lost: the wrapped trigger reports the end, whose outcome is the try's.
                        await asyncio.Event().wait()
                    if lost is not None:
                        return await self._lease_lost(lost)
                    self.log.warning(
                        "Renewing the lease of %s failed; will retry: %s", self.reservation_id, e
                    )
                else:
                    watch.renewed()
                await asyncio.sleep(watch.look_interval)
        finally:
            await asyncio.to_thread(hook.close)

    async def _ended_first(self, lost: LeaseLostError) -> bool:
        """Whether the workload ended before its lease was lost (reconcile released the grant of a
        finished pod before this trigger saw it finish): then nothing is deleted and no loss reported."""
        try:
            ended = await self._workload_ended()
        except Exception:
            self.log.exception("Could not tell whether the workload of %s has ended", self.reservation_id)
            return False
        if ended:
            self.log.info(
                "GPU slice %s ended after its workload did (%s); its outcome decides the try",
                self.reservation_id,
                lost.why,
            )
        return ended

    async def _preempting(self, hook: AsyncGpuPoolHook) -> bool:
        """Whether the grant is being preempted (one read; the renewal then brings the notice)."""
        try:
            reservation = await hook.aget(self.reservation_id)
        except Exception:
            return False  # the renewal, when due, decides what an error means
        return reservation.state is ReservationState.PREEMPTING

    @staticmethod
    async def _lost_first(
        following: asyncio.Future[Any], renewer: asyncio.Task[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """Wait for the wrapped trigger's next event or the lost lease; return the lost lease's event if it came first.

        :param following: the wrapped trigger's next event
        :param renewer: :meth:`_renew_until_lost`, running
        """
        await asyncio.wait({following, renewer}, return_when=asyncio.FIRST_COMPLETED)
        if _failed(following) and not renewer.done():
            # Finding the lease lost, the renewer deletes the workload before it returns: the
            # wrapped trigger, polling it, may see it gone (404) first. The loss is the news.
            await asyncio.wait({renewer}, timeout=_WORKLOAD_DELETED_S)
        if not renewer.done():
            return None
        if not following.done():
            await cancel_quietly(following)
        elif not following.cancelled():
            following.exception()  # seen: asyncio does not warn of an error never retrieved
        return renewer.result()
