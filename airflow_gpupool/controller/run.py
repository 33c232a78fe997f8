"""The controller loop: inventory sync, reconcile and reap on their intervals, while leading.

:class:`GpuPoolController` is what ``gpupool controller run`` runs: the one long-running process
with Kubernetes access. Each sync interval it syncs the cluster's GPU nodes into the ledger
(:func:`~airflow_gpupool.inventory.sync.sync_inventory`), and at every pass the nodes a granted
pod found wrong (suspect, :func:`~airflow_gpupool.inventory.sync.resync_suspect_nodes`); each reconcile interval it reconciles
grants with their pods (:func:`~airflow_gpupool.controller.reconcile.reconcile`), reaps
expired leases (``Ledger.reap``) and acts on the node agents' heartbeats
(:func:`~airflow_gpupool.controller.heartbeats.check_heartbeats`); each autoscale interval, when
pools are scalable, it asks the cluster's autoscaler for the nodes waiting requests need
(:class:`~airflow_gpupool.controller.autoscale.step.Autoscaler`). It acts only while it holds the Lease
(:class:`~airflow_gpupool.controller.leader.LeaderElector`), so replicas never act at once. While
it runs, a thread of its own renews the Lease every retry period, so a long pass (a big cluster,
a slow API server) never lets it lapse to a replica mid-step; reconcile also checks before each
grant that this replica still leads.

An error in one step (the API server or the ledger unreachable, a refused request) is logged and
the step is tried again at its next interval: a long-running loop outlives transient faults. Only
bad configuration, found before the loop starts, ends the process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_gpupool.controller.drift import DriftKeeper, DriftPass
from airflow_gpupool.controller.early_warning import request_emergency_checkpoints
from airflow_gpupool.controller.external_pods import ExternalPodCounter
from airflow_gpupool.controller.gatekeeper import GateResult, gatekeep
from airflow_gpupool.controller.heartbeats import check_heartbeats
from airflow_gpupool.controller.reconcile import ReconcileResult, reconcile
from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.forecast.step import Forecaster
from airflow_gpupool.inventory.sync import SyncResult, resync_suspect_nodes, sync_inventory
from airflow_gpupool.ledger import LedgerHistory
from airflow_gpupool.settings import drift_alert_seconds, history_retention_seconds
from airflow_gpupool.validate import positive_seconds

if TYPE_CHECKING:
    from airflow_gpupool.controller.autoscale.step import AutoscaleResult
    from airflow_gpupool.controller.leader import LeaderElector
    from airflow_gpupool.health import LoopHealth
    from airflow_gpupool.ledger import HeartbeatCheck, Ledger, ReapResult

__all__ = [
    "DEFAULT_AUTOSCALE_INTERVAL",
    "DEFAULT_RECONCILE_INTERVAL",
    "DEFAULT_SYNC_INTERVAL",
    "ControllerIntervals",
    "GpuPoolController",
    "PassResult",
]

log = logging.getLogger(__name__)

DEFAULT_SYNC_INTERVAL = 60.0
DEFAULT_RECONCILE_INTERVAL = 30.0
DEFAULT_GATE_INTERVAL = 2.0  # gatekeeper: a gated pod waits at most this long after its grant
DEFAULT_AUTOSCALE_INTERVAL = 10.0
DEFAULT_FORECAST_INTERVAL = 30.0  # [gpupool] forecast_interval_seconds
DEFAULT_DRIFT_INTERVAL = 30.0  # the drift step reads the watch's cache (no API call) and one ledger snapshot


@dataclass(frozen=True)
class ControllerIntervals:
    """How often each step runs, in seconds.

    :param sync: inventory sync
    :param reconcile: reconcile of grants with pods, then reap
    :param gate: the gatekeeper (admit the pods the executor hook gated)
    :param autoscale: the autoscale step (ask for the nodes waiting requests need)
    :param forecast: the forecast step (each waiting request's start-time quantiles; issue 39)
    :param drift: the drift step (each node's books beside the watched pods; issue 36)
    """

    sync: float = DEFAULT_SYNC_INTERVAL
    reconcile: float = DEFAULT_RECONCILE_INTERVAL
    gate: float = DEFAULT_GATE_INTERVAL
    autoscale: float = DEFAULT_AUTOSCALE_INTERVAL
    forecast: float = DEFAULT_FORECAST_INTERVAL
    drift: float = DEFAULT_DRIFT_INTERVAL

    def __post_init__(self) -> None:
        checked = (
            ("sync interval", self.sync),
            ("reconcile interval", self.reconcile),
            ("gate interval", self.gate),
            ("autoscale interval", self.autoscale),
            ("forecast interval", self.forecast),
            ("drift interval", self.drift),
        )
        for what, value in checked:
            try:
                positive_seconds(value)
            except ValueError as e:
                raise ConfigurationError(f"{what}: {e}") from None


@dataclass
class PassResult:
    """What one pass did; a step that did not run (not due, not leading) or failed is ``None``.

    :param leading: whether this controller held the Lease
    :param errors: ``(step, message)`` for each step that failed
    """

    leading: bool = False
    synced: SyncResult | None = None
    resynced: SyncResult | None = None
    reconciled: ReconcileResult | None = None
    reaped: ReapResult | None = None
    heartbeats: HeartbeatCheck | None = None
    checkpoints_asked: list[str] | None = None
    gated: GateResult | None = None
    autoscaled: AutoscaleResult | None = None
    forecasts: int | None = None
    drift: DriftPass | None = None
    errors: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        """Return the pass's one INFO line, such as ``sync: 2 added, ...; reconcile: 1 released, ...``."""
        parts = []
        if self.synced is not None:
            parts.append(f"sync: {self.synced.summary()}")
        if self.resynced is not None:
            parts.append(f"resync of suspect nodes: {self.resynced.summary()}")
        if self.reconciled is not None:
            parts.append(f"reconcile: {self.reconciled.summary()}")
        if self.reaped is not None:
            r = self.reaped
            parts.append(
                f"reap: {len(r.expired)} expired, {len(r.timed_out)} timed out, {len(r.granted)} granted"
            )
        h = self.heartbeats
        if h is not None and (h.quarantined or h.released):
            parts.append(
                f"heartbeats: {', '.join(n for n, _ in h.quarantined) or 'none'} quarantined, "
                f"{', '.join(h.released) or 'none'} released"
            )
        if self.checkpoints_asked:
            parts.append(f"early warning: checkpoint asked of {', '.join(self.checkpoints_asked)}")
        if self.gated is not None and (self.gated.admitted or self.gated.deleted or self.gated.released):
            parts.append(f"gatekeeper: {self.gated.summary()}")
        a = self.autoscaled
        if a is not None and (a.created or a.deleted):
            parts.append(f"autoscale: {a.summary()}")
        parts += [f"{step} failed: {message}" for step, message in self.errors]
        return "; ".join(parts) or "nothing due"


class GpuPoolController:
    """Sync, reconcile and reap on their intervals while holding the Lease.

    :param ledger: the ledger
    :param core_v1_api: a ``kubernetes.client.CoreV1Api``
    :param elector: the Lease candidate of this process
    :param intervals: how often each step runs
    :param clock: a monotonic clock, in seconds (tests pass a fake one)
    :param count_external_pods: keep a watch on every pod while leading, and count the GPUs of
        pods this project did not make in the ledger (:mod:`~airflow_gpupool.controller.external_pods`)
    :param pod_relist_seconds: the watch lists every pod again at least this often
    :param autoscaler: the autoscale step (:class:`~airflow_gpupool.controller.autoscale.step.Autoscaler`);
        ``None`` when no pool is scalable
    :param health: told of each pass :meth:`run` ends (the liveness and readiness probes)

    A caller of :meth:`run_pass` ends with :meth:`close` (or a ``with`` block): a leading pass
    starts the pod watch, which runs on a thread of its own until then.
    """

    def __init__(
        self,
        ledger: Ledger,
        core_v1_api: Any,
        elector: LeaderElector,
        intervals: ControllerIntervals | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        count_external_pods: bool = True,
        pod_relist_seconds: float = 300.0,
        autoscaler: Callable[[], AutoscaleResult] | None = None,
        health: LoopHealth | None = None,
    ) -> None:
        self.health = health
        self.ledger = ledger
        self.api = core_v1_api
        self.elector = elector
        self.intervals = intervals or ControllerIntervals()
        self._clock = clock
        self.autoscaler = autoscaler
        self._next_sync = self._next_reconcile = self._next_gate = self._next_autoscale = float("-inf")
        self._next_election = self._next_forecast = self._next_drift = float("-inf")
        self.forecaster = Forecaster(ledger)
        self._election = threading.Lock()  # the pass and the Lease keeper both renew
        self.external_pods = (
            ExternalPodCounter(ledger, core_v1_api, relist_seconds=pod_relist_seconds)
            if count_external_pods
            else None
        )
        self._watching = False  # the pod watch runs only while this replica leads
        self.drift = DriftKeeper(ledger, self._watched_gpu_pods, drift_alert_seconds(), self._claim)

    def __enter__(self) -> GpuPoolController:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the pod watch a leading pass started, and release the Lease if this replica holds it."""
        self._stop_watching()
        self.elector.release()

    def run_pass(self) -> PassResult:
        """Renew (or seek) the Lease if due, then run the steps that are due, while leading."""
        now = self._clock()
        if now >= self._next_election:
            self._renew(now)
        result = PassResult(leading=self.elector.is_leader())
        if not result.leading:
            log.debug("Not leading (the Lease is held by %s): nothing done", self.elector.holder)
            self._stop_watching()
            return result
        if now >= self._next_sync:
            self._next_sync = now + self.intervals.sync
            result.synced = self._step(result, "sync", lambda: sync_inventory(self.ledger, self.api))
            if self.external_pods is not None and self._watching:
                self.external_pods.retry_unknown_nodes()
        else:
            # A node a granted pod found wrong is read again at once, not at the next full sync.
            result.resynced = self._step(
                result, "resync", lambda: resync_suspect_nodes(self.ledger, self.api)
            )
        if self.external_pods is not None and not self._watching:
            self._watching = True
            self.external_pods.start()
        if now >= self._next_reconcile and self.elector.is_leader():
            self._next_reconcile = now + self.intervals.reconcile
            result.reconciled = self._step(
                result,
                "reconcile",
                lambda: reconcile(self.ledger, self.api, still_leading=self.elector.is_leader),
            )
            result.reaped = self._step(result, "reap", self.ledger.reap)
            # Issue 17: a node whose agent went silent is quarantined, and released once it is back.
            result.heartbeats = self._step(
                result, "heartbeats", lambda: check_heartbeats(self.ledger, self.api)
            )
            result.checkpoints_asked = self._step(
                result, "early warning", lambda: request_emergency_checkpoints(self.ledger, self.api)
            )
            # Issue 15: the page's history is kept for [gpupool] history_retention_days.
            self._step(
                result, "history", lambda: LedgerHistory(self.ledger).prune(history_retention_seconds())
            )
        self._run_short_steps(now, result)
        admitted = result.gated is not None and bool(result.gated.admitted or result.gated.deleted)
        scaled = result.autoscaled is not None and bool(
            result.autoscaled.created or result.autoscaled.deleted
        )
        if (
            result.synced
            or result.resynced
            or result.reconciled
            or result.reaped
            or result.errors
            or admitted
            or scaled
        ):
            log.info("Controller pass (%s): %s", self.elector.identity, result.summary())
        self._log_details(result)
        return result

    def run(self, stop: threading.Event) -> None:
        """Run passes until ``stop`` is set, then release the Lease.

        :param stop: set (by a signal handler) to end the loop; waiting ends as soon as it is set
        """
        keeper = threading.Thread(
            target=self._keep_lease, args=(stop,), name="gpupool-lease-keeper", daemon=True
        )
        keeper.start()
        try:
            while not stop.is_set():
                self.run_pass()
                if self.health is not None:
                    self.health.beat()
                stop.wait(self._seconds_to_next())
        finally:
            stop.set()
            keeper.join()
            self.close()

    def _stop_watching(self) -> None:
        if self.external_pods is not None and self._watching:
            self._watching = False
            self.external_pods.stop()
            log.info("Not leading any more: the pod watch stopped")

    def _keep_lease(self, stop: threading.Event) -> None:
        """Renew the Lease each time a renewal is due while this replica holds it, whatever the steps do.

        It wakes when the next renewal is due, not a fixed period after its last look, so a renewal
        the pass made just before never stretches the gap to two periods. One renewal slower than
        the renew deadline (a loaded host) ends leadership, but while the Lease still names this
        replica the keeper tries again: nobody else has acted, so renewing is safe, and a long step
        does not hand the Lease to a replica because of one slow call.
        """
        period = self.elector.lease.retry_period
        while not stop.wait(min(period, max(0.01, self._next_election - self._clock()))):
            holds = self.elector.is_leader() or self.elector.holder == self.elector.identity
            if holds and self._clock() >= self._next_election:
                self._renew(self._clock())

    def _renew(self, now: float) -> None:
        with self._election:
            self.elector.try_acquire_or_renew()
            self._next_election = now + self.elector.lease.retry_period

    def run_once(self, wait: Callable[[float], bool] | None = None) -> PassResult:
        """Run one full pass (every step, as if all were due) and release the Lease.

        Another live leader is waited for at most about one lease duration (it may be a controller
        that died, whose Lease must expire first); if it still leads, nothing is done.

        :param wait: sleeps for the seconds given and returns True to give up early (default: sleep)
        """
        wait = wait or _sleep
        deadline = self._clock() + self.elector.lease.lease_duration + 2 * self.elector.lease.retry_period
        try:
            while not self.elector.try_acquire_or_renew():
                if self._clock() >= deadline or wait(self.elector.lease.retry_period):
                    log.warning("The Lease is held by %s: nothing done", self.elector.holder)
                    return PassResult(leading=False)
            self._next_election = self._clock() + self.elector.lease.retry_period
            counter, self.external_pods = self.external_pods, None  # one pass: a list, not a watch
            try:
                result = self.run_pass()
                if counter is not None:
                    self._step(result, "external pods", counter.count_once)
                return result
            finally:
                self.external_pods = counter
        finally:
            self.elector.release()

    def _watched_gpu_pods(self) -> list[dict[str, Any]] | None:
        """Return the watch's cached GPU pods; None before its first list (or with no watch)."""
        counter = self.external_pods
        if counter is None or not self._watching or not counter.gpu_pods.listed:
            return None
        return counter.gpu_pods.pods()

    def _claim(self, namespace: str, name: str, pod_uid: str) -> dict[str, Any] | None:
        """Read a ResourceClaim through the pod watch's cache (the drift step's pods name it)."""
        counter = self.external_pods
        return None if counter is None else counter.claims.lookup(namespace, name, pod_uid)

    def _run_short_steps(self, now: float, result: PassResult) -> None:
        """Run the gatekeeper, the autoscale, forecast and drift steps, those that are due."""
        if now >= self._next_gate and self.elector.is_leader():  # gatekeeper (controller/gatekeeper.py)
            self._next_gate = now + self.intervals.gate
            result.gated = self._step(result, "gatekeeper", lambda: gatekeep(self.ledger, self.api))
        if self.autoscaler is not None and now >= self._next_autoscale and self.elector.is_leader():
            self._next_autoscale = now + self.intervals.autoscale
            result.autoscaled = self._step(result, "autoscale", self.autoscaler)
        if now >= self._next_forecast and self.elector.is_leader():  # issue 39 (forecast/step.py)
            self._next_forecast = now + self.intervals.forecast
            result.forecasts = self._step(result, "forecast", self.forecaster)
        if now >= self._next_drift and self.elector.is_leader():  # issue 36 (controller/drift.py)
            self._next_drift = now + self.intervals.drift
            result.drift = self._step(result, "drift", self.drift)

    # -- helpers -------------------------------------------------------------------------------

    def _seconds_to_next(self) -> float:
        due = min(self._next_election, self._next_sync, self._next_reconcile, self._next_gate)
        due = min(due, self._next_forecast, self._next_drift)
        if self.autoscaler is not None:
            due = min(due, self._next_autoscale)
        if not self.elector.is_leader():
            due = self._next_election
        return max(0.05, due - self._clock())

    def _step(self, result: PassResult, step: str, run: Callable[[], Any]) -> Any:
        try:
            return run()
        except Exception as e:  # a long-running loop outlives any one fault; logged, retried next time
            log.error(
                "Controller %s failed (retried in the next pass): %s",
                step,
                e,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
            result.errors.append((step, f"{type(e).__name__}: {e}"))
            return None

    @staticmethod
    def _log_details(result: PassResult) -> None:
        if not log.isEnabledFor(logging.DEBUG):
            return
        if result.synced is not None:
            log.debug("sync: %s", result.synced.to_dict())
        for rid, reason in result.reconciled.released if result.reconciled else ():
            log.debug("reconcile released %s: %s", rid, reason)
        if result.reaped is not None:
            log.debug(
                "reap: expired %s, timed out %s", list(result.reaped.expired), list(result.reaped.timed_out)
            )


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return False
