"""The base of every airflow-gpupool error: an Airflow ``AirflowException``, as task code expects."""

from __future__ import annotations

import contextlib
import sys

# Importing Airflow may log to stdout (its unit-test mode does): keep stdout for the caller's own
# output (the CLI's JSON, a child process's protocol).
with contextlib.redirect_stdout(sys.stderr):
    from airflow.sdk.exceptions import AirflowException


__all__ = ["GpuPoolError"]


class GpuPoolError(AirflowException):
    """Base class of every error raised by airflow-gpupool: an ``AirflowException``, as task code expects."""
