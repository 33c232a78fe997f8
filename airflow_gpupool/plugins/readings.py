"""The GPU pool app's readings of the ledger: one cached reading per process, shared by the page,
the JSON API and ``/metrics`` until it is stale, and the fragmentation samples taken as it is read.

Imported only when the app is built (:mod:`~airflow_gpupool.plugins.app`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from airflow_gpupool.ledger import Ledger, LedgerSnapshot

__all__ = ["AppState", "CachedLedger", "FragmentationSampler", "Reading", "default_ledger"]

T = TypeVar("T")
#: Waiters explained per reading (the head of the queue; each explanation places the request).
_MAX_EXPLAINED = 20


class FragmentationSampler:
    """Keep recent ``(time, allocation, fragmentation)`` samples taken as the ledger is read.

    Fragmentation depends on every GPU's free capacity, which the ledger does not keep
    over time, so the chart's fragmentation line is sampled whenever the page, the API
    or a scrape reads a snapshot (at most once per ``min_interval`` seconds).

    :param maxlen: samples kept
    :param min_interval: seconds between two samples
    """

    def __init__(self, maxlen: int = 2880, min_interval: float = 15.0) -> None:
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self.min_interval = min_interval

    def add(self, at: float, allocation: float, fragmentation: float) -> None:
        """Record a sample unless the previous one is too recent.

        :param at: the snapshot's time
        :param allocation: allocation ratio then
        :param fragmentation: fragmentation ratio then
        """
        with self._lock:
            if self._samples and at - self._samples[-1][0] < self.min_interval:
                return
            self._samples.append((at, allocation, fragmentation))

    def since(self, t0: float) -> list[tuple[float, float, float]]:
        """Return the samples taken at or after ``t0``.

        :param t0: seconds since the epoch
        """
        with self._lock:
            return [s for s in self._samples if s[0] >= t0]


def default_ledger() -> Ledger:
    from airflow_gpupool.hooks.gpupool import GpuPoolHook

    return GpuPoolHook().ledger


@dataclass(frozen=True)
class Reading:
    """One read of the ledger shared by the page, the JSON API and the metrics until it is stale."""

    snapshot: LedgerSnapshot
    fragmentation: float
    explanations: dict[str, str]
    read_at: float  # monotonic
    #: What is computed from the reading once (the chart's series and the use per range, the facets).
    derived: dict[tuple[Any, ...], Any] = field(default_factory=dict)


class AppState:
    """The app's ledger and its one cached reading per process.

    :param snapshot_ttl: seconds a reading is served before the ledger is read again (0: always
        read): at 1,000 nodes a snapshot takes about half a second, and every viewer's refresh
        and every scrape would take it again
    """

    def __init__(self, ledger_factory: Callable[[], Ledger], snapshot_ttl: float = 5.0) -> None:
        self._factory = ledger_factory
        self._ledger: Ledger | None = None
        self._lock = threading.Lock()
        self._reading_lock = threading.Lock()
        self._reading: Reading | None = None
        self._derived_lock = threading.Lock()
        self.snapshot_ttl = snapshot_ttl
        self.sampler = FragmentationSampler()

    def known_url(self) -> str | None:
        """The ledger's URL, if it was opened (to hide its password from error texts)."""
        return self._ledger.url if self._ledger is not None else None

    def ledger(self) -> Ledger:
        with self._lock:
            if self._ledger is None:
                self._ledger = self._factory()
            return self._ledger

    def invalidate(self) -> None:
        """Forget the cached reading: the next request reads the ledger."""
        with self._reading_lock:
            self._reading = None

    def reading(self) -> Reading:
        """Return the cached reading, or read the ledger when it is older than ``snapshot_ttl``."""
        # One reader at a time: viewers arriving while it reads get its reading, not a read of their own.
        with self._reading_lock:
            cached = self._reading
            if cached is not None and time.monotonic() - cached.read_at < self.snapshot_ttl:
                return cached
            from airflow_gpupool.metrics.collector import fragmentation_ratio

            snapshot = self.ledger().snapshot()
            frag = fragmentation_ratio(snapshot)
            self.sampler.add(snapshot.taken_at, snapshot.allocation, frag)
            self._reading = Reading(snapshot, frag, self._explain(snapshot), time.monotonic())
            return self._reading

    def derived(self, key: tuple[Any, ...], compute: Callable[[LedgerSnapshot], T]) -> T:
        """Return ``compute(snapshot)`` of the current reading, computed once per reading and ``key``."""
        reading = self.reading()
        with self._derived_lock:
            if key not in reading.derived:
                reading.derived[key] = compute(reading.snapshot)
            return cast("T", reading.derived[key])

    def snapshot(self) -> tuple[LedgerSnapshot, float]:
        reading = self.reading()
        return reading.snapshot, reading.fragmentation

    def explanations(self, snapshot: LedgerSnapshot) -> dict[str, str]:
        reading = self.reading()
        return reading.explanations if reading.snapshot is snapshot else self._explain(snapshot)

    def _explain(self, snapshot: LedgerSnapshot) -> dict[str, str]:
        waiting = snapshot.queue[:_MAX_EXPLAINED]
        why = self.ledger().explain_many(r.id for r in waiting)
        # One that left the queue since the snapshot: its stored message is what there is.
        return {r.id: why.get(r.id, r.message) for r in waiting}

    def series(self, hours: float, snapshot: LedgerSnapshot | None = None) -> dict[str, Any]:
        from airflow_gpupool.ledger import allocation_series, held_spans

        ledger = self.ledger()
        if snapshot is None:
            snapshot, _ = self.snapshot()
        t1 = snapshot.taken_at
        t0 = t1 - hours * 3600
        spans = held_spans(ledger.url, t0)
        starts = [s.start for s in spans if s.start > t0]
        if starts and len(starts) == len(spans):
            # Everything happened inside the window: zoom to it rather than draw a flat line.
            t0 = max(t0, min(starts) - max(60.0, (t1 - min(starts)) * 0.05))
        return {
            "since": t0,
            "until": t1,
            "allocation": allocation_series(spans, snapshot.gpu_capacity_milli, t0, t1),
            "fragmentation": [(t, f) for t, _a, f in self.sampler.since(t0)],
        }


class CachedLedger:
    """What the metrics collector reads of a ledger: URL and snapshot from the cache, quotas read through."""

    def __init__(self, state: AppState) -> None:
        self._state = state

    @property
    def url(self) -> str:
        return self._state.ledger().url

    def snapshot(self) -> LedgerSnapshot:
        return self._state.reading().snapshot

    def read(self, fn: Callable[[Connection], T]) -> T:
        return self._state.ledger().read(fn)
