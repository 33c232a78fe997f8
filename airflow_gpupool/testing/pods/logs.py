"""Container logs kept by the simulated kubelet, served as the API server serves them."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import AsyncIterator


def k8s_timestamp(when: datetime.datetime) -> str:
    """Return a timestamp in the RFC 3339 form with nanoseconds that ``timestamps=true`` prefixes.

    :param when: an aware datetime
    """
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


@dataclasses.dataclass(frozen=True)
class LogOptions:
    """Query options of a log request.

    :param timestamps: prefix each line with its timestamp
    :param tail_lines: only the last lines
    :param since: only lines at or after this time
    :param limit_bytes: truncate the answer
    """

    timestamps: bool = False
    tail_lines: int | None = None
    since: datetime.datetime | None = None
    limit_bytes: int | None = None


class ContainerLog:
    """The log of one container: timestamped lines and whether the container has ended."""

    def __init__(self) -> None:
        self.lines: list[tuple[datetime.datetime, str]] = []
        self.finished = False
        self._changed = asyncio.Event()

    def _notify(self) -> None:
        """Wake every follower."""
        self._changed.set()
        self._changed = asyncio.Event()

    def append(self, line: str) -> None:
        """Add a line written now.

        :param line: the text, without newline
        """
        self.lines.append((datetime.datetime.now(tz=datetime.UTC), line))
        self._notify()

    def finish(self) -> None:
        """Mark the container as ended: followers get the rest and their stream closes."""
        self.finished = True
        self._notify()

    @staticmethod
    def options(
        *,
        timestamps: bool = False,
        tail_lines: int | None = None,
        since_seconds: float | None = None,
        since_time: str | None = None,
        limit_bytes: int | None = None,
    ) -> LogOptions:
        """Return options from the query parameters of a log request.

        :param timestamps: ``timestamps=true``
        :param tail_lines: ``tailLines``
        :param since_seconds: ``sinceSeconds``
        :param since_time: ``sinceTime`` (RFC 3339)
        :param limit_bytes: ``limitBytes``
        """
        since = None
        if since_seconds is not None:
            since = datetime.datetime.now(tz=datetime.UTC) - datetime.timedelta(seconds=since_seconds)
        elif since_time:
            since = datetime.datetime.fromisoformat(since_time.replace("Z", "+00:00"))
        return LogOptions(timestamps=timestamps, tail_lines=tail_lines, since=since, limit_bytes=limit_bytes)

    def _format(self, entries: list[tuple[datetime.datetime, str]], options: LogOptions) -> str:
        """Render lines.

        :param entries: the lines
        :param options: the request options
        """
        if options.timestamps:
            return "".join(f"{k8s_timestamp(when)} {line}\n" for when, line in entries)
        return "".join(f"{line}\n" for _, line in entries)

    def _selected(self, options: LogOptions) -> list[tuple[datetime.datetime, str]]:
        """Return the lines a request asks for.

        :param options: the request options
        """
        entries = [e for e in self.lines if options.since is None or e[0] >= options.since]
        if options.tail_lines is not None:
            entries = entries[-options.tail_lines :] if options.tail_lines > 0 else []
        return entries

    def render(self, options: LogOptions) -> str:
        """Return the log text for a non-following request.

        :param options: the request options
        """
        text = self._format(self._selected(options), options)
        return text[: options.limit_bytes] if options.limit_bytes is not None else text

    async def follow(self, options: LogOptions) -> AsyncIterator[str]:
        """Yield the selected lines, then new ones as they come, until the container ends.

        :param options: the request options (``limitBytes`` is not applied while following)
        """
        entries = self._selected(options)
        sent = len(self.lines)
        if entries:
            yield self._format(entries, options)
        while True:
            changed = self._changed
            if len(self.lines) > sent:
                new, sent = self.lines[sent:], len(self.lines)
                yield self._format(new, options)
                continue
            if self.finished:
                return
            await changed.wait()


class LogBook:
    """Every container log, keyed by pod uid and container name."""

    def __init__(self) -> None:
        self._logs: dict[tuple[str, str], ContainerLog] = {}

    def get(self, uid: str, container: str) -> ContainerLog | None:
        """Return a container's log, or ``None`` if the container never started.

        :param uid: pod uid
        :param container: container name
        """
        return self._logs.get((uid, container))

    def open(self, uid: str, container: str) -> ContainerLog:
        """Return the log of a starting container, creating it.

        :param uid: pod uid
        :param container: container name
        """
        return self._logs.setdefault((uid, container), ContainerLog())

    def finish_pod(self, uid: str) -> None:
        """End every log of a pod.

        :param uid: pod uid
        """
        for (log_uid, _), log in self._logs.items():
            if log_uid == uid and not log.finished:
                log.finish()

    def clear(self) -> None:
        """Forget every log."""
        for log in self._logs.values():
            log.finish()
        self._logs.clear()
