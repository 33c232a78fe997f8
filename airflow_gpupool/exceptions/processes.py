"""The demo's process supervisor (``make ui``): a signal that stops it, a service that ends under it."""

from __future__ import annotations

import signal

from airflow_gpupool.exceptions.base import GpuPoolError

__all__ = ["ServiceEndedError", "SupervisorStoppedError"]


class SupervisorStoppedError(GpuPoolError):
    """A signal asked the supervisor to stop while it was starting services.

    :param signum: the signal
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class ServiceEndedError(GpuPoolError):
    """A service ended while the others needed it.

    :param name: the service
    :param returncode: its exit status (negative: killed by that signal)
    """

    def __init__(self, name: str, returncode: int) -> None:
        super().__init__(f"{name} ended with exit status {returncode}")
        self.name = name
        self.returncode = returncode
