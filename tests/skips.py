"""Skip a test whose prerequisite is missing here, but fail it under ``CI=true``: CI must run it.

A prerequisite that CI installs (PostgreSQL, a browser, promtool) may be missing on a laptop;
there the test skips with the reason. Under CI a skip would pass silently, so it fails instead.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def under_ci() -> bool:
    """Return whether the ``CI`` environment variable says true (in any case)."""
    return os.environ.get("CI", "").strip().lower() == "true"


def skip_or_fail(reason: str, *, what: str = "this test") -> NoReturn:
    """Skip the running test with ``reason``; under ``CI=true``, fail it.

    :param reason: why it cannot run here, and how to make it run
    :param what: what CI must run, for the failure message ("CI must run <what>: <reason>")
    """
    __tracebackhide__ = True  # the skip and the failure point at the caller, not here
    if under_ci():
        pytest.fail(f"CI must run {what}: {reason}")
    pytest.skip(reason)
