"""CheckpointSensor: follow a training's checkpoints; report progress, stalls and completion."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_gpupool.checkpoints.manifest import CheckpointManifest
from airflow_gpupool.checkpoints.progress import CheckpointEventStatus, assess
from airflow_gpupool.checkpoints.store import CheckpointStore
from airflow_gpupool.exceptions import CheckpointStalledError, ConfigurationError, GpuPoolError
from airflow_gpupool.notifiers.escalation import Escalation, notify_escalation
from airflow_gpupool.task_try import TaskTry
from airflow_gpupool.triggers.checkpoint import CheckpointTrigger
from airflow_gpupool.validate import positive_seconds

if TYPE_CHECKING:
    from airflow.sdk import Context

# CheckpointStalledError is defined with the other errors; re-exported here, its first home.
__all__ = ["ON_STALL", "XCOM_MANIFEST_KEY", "XCOM_STEP_KEY", "CheckpointSensor", "CheckpointStalledError"]

XCOM_STEP_KEY = "checkpoint_step"
XCOM_MANIFEST_KEY = "checkpoint_manifest"
ON_STALL = ("fail", "escalate")


def _seconds(name: str, value: float | timedelta | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):  # a DAG argument, not text from a config file
        raise ConfigurationError(f"{name}={value!r}: expected a positive number of seconds or a timedelta")
    try:
        return positive_seconds(value)
    except ValueError:
        raise ConfigurationError(
            f"{name}={value!r}: expected a positive number of seconds or a timedelta"
        ) from None


class CheckpointSensor(BaseSensorOperator):
    """Wait until a training writes its completion marker, reporting each new valid checkpoint.

    Every new valid checkpoint goes to XCom (``checkpoint_step``, ``checkpoint_manifest``) and
    triggers retention (``keep_checkpoints``); incomplete or corrupt step directories are skipped
    with a warning. Completion returns the newest manifest. Deferrable by default (the
    ``[operators] default_deferrable`` setting); ``deferrable=False`` pokes.

    :param checkpoint_dir: the location (URL, local path or ObjectStoragePath string)
    :param conn_id: an Airflow connection for the filesystem; None for fsspec's defaults
    :param max_interval: seconds (or a timedelta) without a new valid checkpoint that make a stall
    :param on_stall: ``fail`` (raise :class:`CheckpointStalledError`) or ``escalate`` (notify, keep watching)
    :param escalation_notifier: called on an escalated stall (default :class:`EscalationNotifier`)
    :param keep_checkpoints: prune to this many valid checkpoints after each new one (None: never prune)
    :param deferrable: wait in the triggerer
    """

    template_fields: Sequence[str] = ("checkpoint_dir",)
    ui_color = "#b4d98f"

    def __init__(
        self,
        *,
        checkpoint_dir: str,
        conn_id: str | None = None,
        max_interval: float | timedelta | None = None,
        on_stall: str = "fail",
        escalation_notifier: Any = None,
        keep_checkpoints: int | None = 5,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if on_stall not in ON_STALL:
            raise ConfigurationError(f"on_stall={on_stall!r}: expected one of {ON_STALL}")
        if keep_checkpoints is not None and (isinstance(keep_checkpoints, bool) or keep_checkpoints < 1):
            raise ConfigurationError(f"keep_checkpoints={keep_checkpoints!r}: expected at least 1, or None")
        if self.mode == "reschedule" and max_interval is not None:
            # Between reschedules the sensor keeps no memory of when it last saw progress.
            raise ConfigurationError(
                "max_interval needs mode='poke' or deferrable=True, not mode='reschedule'"
            )
        self.checkpoint_dir = checkpoint_dir
        self.conn_id = conn_id
        self.max_interval = _seconds("max_interval", max_interval)
        self.on_stall = on_stall
        self.escalation_notifier = escalation_notifier
        self.keep_checkpoints = keep_checkpoints
        self.deferrable = deferrable
        self._last_step = -1
        self._since: float | None = None

    def _store(self) -> CheckpointStore:
        return CheckpointStore(self.checkpoint_dir, conn_id=self.conn_id)

    # -- poke mode ---------------------------------------------------------------------------

    def poke(self, context: Context) -> bool | PokeReturnValue:
        """Scan once; report progress, return on completion, act on a stall."""
        now = time.time()
        if self._since is None:
            self._since = now
        verdict = assess(
            self._store().scan(),
            last_step=self._last_step,
            since=self._since,
            now=now,
            max_interval=self.max_interval,
        )
        newest = verdict.newest
        done = self._handle(context, verdict.status, newest, verdict.message)
        if done:
            return PokeReturnValue(is_done=True, xcom_value=newest.to_dict() if newest else None)
        return False

    def _handle(
        self,
        context: Context,
        status: CheckpointEventStatus | None,
        newest: CheckpointManifest | None,
        message: str,
    ) -> bool:
        """Act on one assessment; return whether the training is complete."""
        if status is CheckpointEventStatus.ERROR:
            raise GpuPoolError(f"watching checkpoints at {self.checkpoint_dir} failed: {message}")
        if newest is not None and newest.step > self._last_step:
            self._report(context, newest)
        if status is CheckpointEventStatus.COMPLETED:
            self.log.info("Checkpoints at %s: %s", self.checkpoint_dir, message)
            return True
        if status is CheckpointEventStatus.STALLED:
            self._stalled(context, newest, message)
        return False

    def _report(self, context: Context, newest: CheckpointManifest) -> None:
        self.log.info("Checkpoint step %d at %s, metrics %s", newest.step, newest.location, newest.metrics)
        ti = context["ti"]
        ti.xcom_push(key=XCOM_STEP_KEY, value=newest.step)
        ti.xcom_push(key=XCOM_MANIFEST_KEY, value=newest.to_dict())
        self._last_step, self._since = newest.step, time.time()
        if self.keep_checkpoints is not None:
            pruned = self._store().prune(self.keep_checkpoints)
            if pruned:
                self.log.info("Pruned checkpoint steps %s (keeping %d)", pruned, self.keep_checkpoints)

    def _stalled(self, context: Context, newest: CheckpointManifest | None, message: str) -> None:
        step = newest.step if newest else None
        if self.on_stall == "fail":
            raise CheckpointStalledError(self.checkpoint_dir, step, message)
        escalation = Escalation(
            task=TaskTry.from_context(context),
            failure_class="stalled",
            reason=message,
            decision="on_stall=escalate: a person decides; the sensor keeps watching",
            last_checkpoint_step=step,
        )
        notify_escalation(escalation, context, self.escalation_notifier)
        self._since = time.time()  # the next notice only after another quiet max_interval

    # -- deferrable mode ---------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        """Defer to :class:`CheckpointTrigger`, or poke in place."""
        if not self.deferrable:
            return super().execute(context)
        self._defer(last_step=-1, since=time.time())
        return None

    def _defer(self, *, last_step: int, since: float) -> None:
        self.defer(
            trigger=CheckpointTrigger(
                checkpoint_dir=self.checkpoint_dir,
                conn_id=self.conn_id,
                last_step=last_step,
                since=since,
                max_interval=self.max_interval,
                poll_interval=float(self.poke_interval),
            ),
            method_name="execute_complete",
            kwargs={"last_step": last_step, "since": since},
            timeout=timedelta(seconds=float(self.timeout)),
        )

    def execute_complete(
        self, context: Context, event: dict[str, Any], last_step: int = -1, since: float | None = None
    ) -> Any:
        """Act on the trigger's event; watch on unless the training completed."""
        self._last_step = last_step
        self._since = since if since is not None else time.time()
        status = CheckpointEventStatus(event["status"])
        newest = CheckpointManifest.from_dict(event["manifest"]) if event.get("manifest") else None
        if self._handle(context, status, newest, event["message"]):
            return newest.to_dict() if newest else None
        self._defer(last_step=self._last_step, since=self._since)
        return None
