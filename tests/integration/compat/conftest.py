"""Compat-suite fixtures: the Kubernetes API retries of both operators wait milliseconds, not seconds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def fast_api_retries() -> Iterator[None]:
    """Retry the Kubernetes API as ``[workers] api_retry_wait_min = 0.01``, ``api_retry_wait_max = 0.05``.

    The provider reads those options once, at import; its retry waits look the backoff up at each
    call. Both operators go through the same retries (same attempts, same final error), so the
    comparison is unchanged: an injected HTTP 500 no longer costs a minute of backoff per run.
    """
    import tenacity
    from airflow.providers.cncf.kubernetes import kubernetes_helper_functions as helpers

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(helpers, "_default_wait", tenacity.wait_exponential(min=0.01, max=0.05))
        yield
