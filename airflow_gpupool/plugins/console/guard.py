"""Who may act on the pool, and the form token that keeps other sites from acting for them.

An action changes the pool that every team shares, so it needs what changing an Airflow pool
needs: ``is_authorized_pool(method="PUT")`` of the configured auth manager. With Airflow's
simple auth manager that is the ``op`` and ``admin`` roles; ``viewer`` and ``user`` may only
look. The page reads with any signed-in user, as before.

The Airflow UI authenticates the page by its ``_token`` cookie, which a browser sends with a
form posted from any site: every form carries a token bound to the user (an HMAC keyed by the
API server's ``[api_auth] jwt_secret``, shared by every API server; a random per-process key
where none is set), and a post without it, or from another site, is refused. A client that
sends ``Authorization: Bearer`` chose to send it: no form token is asked of it.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
from typing import TYPE_CHECKING, Any

from airflow_gpupool.exceptions import ConsoleActionRefusedError

if TYPE_CHECKING:
    from fastapi import Request

__all__ = ["PERMISSION", "actor_name", "form_token", "may_act", "check_form"]

#: What the page says an action needs.
PERMISSION = "edit permission on Pools (is_authorized_pool, method PUT): Airflow's op or admin role"


def may_act(user: Any) -> bool:
    """Whether ``user`` may act on the pool: the auth manager's ``is_authorized_pool`` for ``PUT``."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import PoolDetails

    return bool(
        get_auth_manager().is_authorized_pool(method="PUT", user=user, details=PoolDetails(name="gpupool"))
    )


def actor_name(user: Any) -> str:
    """The user's name as the history records it."""
    return str(user.get_name() or user.get_id())


@functools.cache
def _key() -> bytes:
    from airflow.configuration import conf

    secret = conf.get("api_auth", "jwt_secret", fallback="") or ""
    return (
        hashlib.sha256(b"gpupool-console\0" + secret.encode()).digest() if secret else secrets.token_bytes(32)
    )


def form_token(user: Any) -> str:
    """The token the page puts in every form of ``user``."""
    return hmac.new(_key(), f"act:{user.get_id()}".encode(), hashlib.sha256).hexdigest()


def check_form(request: Request, user: Any, token: str | None) -> None:
    """Refuse (403) a post from another site, or a cookie-authenticated post without the user's form token."""
    if request.headers.get("sec-fetch-site") == "cross-site":
        raise ConsoleActionRefusedError(403, "refused: the form was posted from another site")
    if request.headers.get("authorization", "").lower().startswith("bearer "):
        return
    if not token or not hmac.compare_digest(token, form_token(user)):
        raise ConsoleActionRefusedError(
            403, "refused: the form's token is missing or stale; reload the page and try again"
        )
