"""Long-running processes: the demo's supervisor (``make ui``) stopped or left without a service, the controller's pod watch expired."""

from __future__ import annotations

import signal

from airflow_gpupool.exceptions.base import GpuPoolError

__all__ = ["ServiceEndedError", "SupervisorStoppedError", "WatchExpiredError"]


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


class WatchExpiredError(GpuPoolError):
    """A watch cannot go on from where it is (``410 Gone``, another error event, or a relist is due): list again.

    The controller's pod watch catches it and lists again; it never reaches a user.
    """
