"""Health endpoints of the long-running processes (the controller, the node agent) for kubelet probes.

A loop calls :meth:`LoopHealth.beat` after each pass. ``GET /healthz`` (the liveness probe) answers
200 while the last pass ended less than ``stale_after`` seconds ago, else 503, so a loop stuck in a
call that never returns is restarted; ``GET /readyz`` (the readiness probe) answers 200 once a first
pass has ended. A standby controller replica passes both: it makes passes too (it seeks the Lease),
and it must stay ready to take over. The server is the standard library's, in a daemon thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from airflow_gpupool.exceptions import GpuPoolError
from airflow_gpupool.validate import positive_seconds

__all__ = ["LoopHealth", "serve_health", "stale_after_for"]

log = logging.getLogger(__name__)

#: A loop slower than this is not counted stuck, however short its interval: a slow API server or
#: ledger must not get a healthy replica restarted.
MIN_STALE_AFTER = 120.0


def stale_after_for(longest_interval: float) -> float:
    """Return the seconds without a pass after which a loop counts as stuck: four of its longest waits.

    :param longest_interval: the longest the loop sleeps between two passes, in seconds
    """
    return max(MIN_STALE_AFTER, 4 * longest_interval)


class LoopHealth:
    """When a loop last ended a pass, and whether that is recent enough.

    :param stale_after: seconds without a pass after which the loop counts as stuck
    :param clock: a monotonic clock, in seconds (tests pass a fake one)
    """

    def __init__(self, stale_after: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_after = positive_seconds(stale_after)
        self._clock = clock
        self._last_pass: float | None = None

    def beat(self) -> None:
        """Record that a pass has just ended."""
        self._last_pass = self._clock()

    def ready(self) -> bool:
        """Return whether a first pass has ended."""
        return self._last_pass is not None

    def alive(self) -> tuple[bool, str]:
        """Return whether the loop is alive, and why (the probe's response body)."""
        if self._last_pass is None:
            # Not yet started is not stuck: the probe's initialDelaySeconds covers the start.
            return True, "starting: no pass yet"
        ago = self._clock() - self._last_pass
        if ago > self.stale_after:
            return False, f"stuck: last pass {ago:.0f}s ago (more than {self.stale_after:g}s)"
        return True, f"ok: last pass {ago:.0f}s ago"


def serve_health(health: LoopHealth, port: int, bind: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve ``/healthz`` and ``/readyz`` in a daemon thread; call ``shutdown()`` on the result to stop.

    :param health: the loop's health
    :param port: TCP port (0: any free one, as ``server_address`` then says)
    :param bind: address to listen on
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                ok, why = health.alive()
            elif self.path == "/readyz":
                ok = health.ready()
                why = "ready" if ok else "not ready: no pass yet"
            else:
                self.send_error(404, "only /healthz and /readyz")
                return
            body = f"{why}\n".encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("health: " + format, *args)

    try:
        server = ThreadingHTTPServer((bind, port), Handler)
    except OSError as e:  # a name that does not resolve (socket.gaierror), a port in use
        raise GpuPoolError(f"cannot serve /healthz on {bind}:{port}: {e.strerror or e}") from e
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="gpupool-health", daemon=True).start()
    log.info("Serving /healthz and /readyz on http://%s:%d", bind, server.server_address[1])
    return server
