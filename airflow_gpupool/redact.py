"""The one way a database URL is shown: with its password hidden.

Every URL that is printed, logged, raised or returned for people to read goes through
:func:`redact_url`; :func:`scrub` hides a URL's password inside a text that may quote it (a driver
error, an exception from below). URLs made from connection fields are built with
:func:`sqlalchemy.engine.URL.create` (:func:`ledger_url_from_fields`), never by concatenation, so a
password with ``@``, ``/`` or ``#`` is not misread as the host or the path.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote

__all__ = ["HIDDEN", "ledger_url_from_fields", "redact_url", "scrub"]

#: What stands for a hidden password (SQLAlchemy's own mask).
HIDDEN = "***"

# Query parameters libpq and the drivers read a password from.
_SECRET_PARAMS = re.compile(r"(?i)([?&](?:password|passwd|pass|pwd|sslpassword)=)[^&#]*")


def _mask_userinfo(url: str) -> str:
    # Textual masking: everything between the user's ':' and the LAST '@' of the text is the
    # password. Over-masks a path that holds an '@' (safe), never shows part of a password.
    scheme, sep, rest = url.partition("://")
    if not sep:
        # Not a URL at all: what stands before an '@' may be credentials.
        return f"{HIDDEN}@{url.rpartition('@')[2]}" if "@" in url else url
    if "@" not in rest:
        return url
    userinfo, _, after = rest.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    if not colon:
        return url
    return f"{scheme}://{user}:{HIDDEN}@{after}"


def redact_url(url: object) -> str:
    """Return ``url`` with its password (in the authority or the query) replaced by ``***``.

    Uses SQLAlchemy's ``render_as_string(hide_password=True)`` when the URL parses cleanly; a
    URL that does not (a bad port, a password with an unescaped ``@``) is masked textually, so
    nothing of the password is shown in either case.

    :param url: a URL (or anything; ``None`` gives ``'None'``)
    """
    text = str(url)
    masked = _mask_userinfo(text)
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(text)
        rendered = parsed.render_as_string(hide_password=True)
    except Exception:  # anything unparseable is masked textually instead
        rendered = masked
    else:
        # SQLAlchemy splits ``user:p@ss@host`` at the first '@' (and a '#' or '/' may end its
        # password early): its rendering is only trusted when it found the whole password.
        if parsed.password != _textual_password(text):
            rendered = masked
    return _SECRET_PARAMS.sub(rf"\g<1>{HIDDEN}", rendered)


def _textual_password(url: str) -> str | None:
    scheme, sep, rest = url.partition("://")
    userinfo = rest.rpartition("@")[0] if sep else ""
    if ":" not in userinfo:
        return None
    return unquote(userinfo.partition(":")[2])


def _passwords(url: str) -> list[str]:
    found: list[str] = []
    scheme, sep, rest = url.partition("://")
    rest = rest if sep else url  # not a URL: what stands before an '@' may still be credentials
    if "@" in rest:
        userinfo = rest.rpartition("@")[0]
        if ":" in userinfo:
            raw = userinfo.partition(":")[2]
            found += [raw, unquote(raw)]
    query = url.partition("?")[2]
    found += [v for k, v in parse_qsl(query) if k.lower() in {"password", "passwd", "pass", "pwd"}]
    return sorted({p for p in found if p}, key=len, reverse=True)


def scrub(text: str, *urls: str | None) -> str:
    """Return ``text`` with each URL shown redacted and each URL's password replaced by ``***``.

    For texts made elsewhere (a driver's error, an exception's message) that may quote a URL.

    :param text: the text to show
    :param urls: the URLs whose passwords must not appear
    """
    for url in filter(None, urls):
        text = text.replace(url, redact_url(url))
        for password in _passwords(url):
            text = text.replace(password, HIDDEN)
    return text


def ledger_url_from_fields(
    *, login: str | None, password: str | None, host: str, port: int | None, schema: str | None
) -> str:
    """Return the PostgreSQL URL of a connection's fields, its parts escaped by ``URL.create``.

    :param login: user name
    :param password: password (may hold ``@``, ``/``, ``#``)
    :param host: server host
    :param port: server port
    :param schema: the database (default ``gpupool``)
    """
    from sqlalchemy.engine import URL

    url = URL.create(
        "postgresql",
        username=login or None,
        password=password or None,
        host=host,
        port=int(port) if port else None,
        database=schema or "gpupool",
    )
    return url.render_as_string(hide_password=False)
