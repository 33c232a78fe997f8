"""The Alibaba GPU trace 2023, fetched from its upstream repository instead of shipped.

The trace is third-party data: airflow-gpupool does not ship it. ``gpupool traces fetch``
downloads the files the simulator needs from Alibaba's public ``clusterdata`` repository
(the URLs and SHA-256 sums are pinned here), into a cache under
``$XDG_CACHE_HOME/airflow-gpupool/traces`` (default ``~/.cache/...``) or a folder of your
choice. The simulator reads them from ``$GPUPOOL_TRACE_DIR`` when set, else from the cache.
"""

from __future__ import annotations

import hashlib
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from airflow_gpupool.exceptions import ConfigurationError, TraceFetchError

__all__ = [
    "BASE_URL",
    "FILES",
    "TRACE_DIR_ENV",
    "TRACE_SET",
    "cache_dir",
    "fetch",
    "stderr_bar",
    "trace_root",
]

#: Where the named traces are read from: ``$GPUPOOL_TRACE_DIR/<TRACE_SET>/<file>``.
TRACE_DIR_ENV = "GPUPOOL_TRACE_DIR"
TRACE_SET = "alibaba-gpu-v2023"
#: The folder of the trace in Alibaba's clusterdata repository (raw files).
BASE_URL = "https://raw.githubusercontent.com/alibaba/clusterdata/master/cluster-trace-gpu-v2023/csv"
#: The files the simulator reads, and the SHA-256 of each as published upstream.
FILES: dict[str, str] = {
    "openb_node_list_gpu_node.csv": "2beca64b4d3dfa342036a34b56a495c6cef9225db836c81f541282cb1df320b5",
    "openb_pod_list_default.csv": "1ee7ed79c27a3b0861cda8ddba86a004c6aba904caafa329a76ae93ca63834a8",
    "openb_pod_list_gpushare100.csv": "12dbc07d6a49bf8641e2275a2ff5bf7be74b5df7d148d531e135b140b95f9a3d",
    "openb_pod_list_gpuspec33.csv": "eca4f746db1e5b25864ad021b55ece3943e101a3ebd4574d09dcb95c46117652",
    "openb_pod_list_multigpu50.csv": "206f2f5959db30ecb7c44e7f13197c8ec50b7a35558ad3777cc3662ef0fe5373",
}
_CHUNK = 64 * 1024
#: Seconds a download may stall before it fails.
_TIMEOUT_S = 60

Progress = Callable[[str, int, int | None], None]


def cache_dir() -> Path:
    """Return the cache the fetched traces go to: ``$XDG_CACHE_HOME/airflow-gpupool/traces``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "airflow-gpupool" / "traces"


def _holds(folder: Path, filename: str) -> Path | None:
    """Return the trace folder under ``folder`` (itself or its ``TRACE_SET``) holding ``filename``."""
    for candidate in (folder / TRACE_SET, folder):
        if (candidate / filename).is_file():
            return candidate
    return None


def trace_root(filename: str) -> Path:
    """Return the folder holding ``filename`` of the trace: ``$GPUPOOL_TRACE_DIR``, else the cache.

    ``GPUPOOL_TRACE_DIR`` may name the folder above ``alibaba-gpu-v2023`` or that folder itself.

    :raises ConfigurationError: neither holds it; the message says how to fetch it
    """
    root = os.environ.get(TRACE_DIR_ENV)
    if root:
        found = _holds(Path(root).expanduser(), filename)
        if found is None:
            raise ConfigurationError(
                f"{TRACE_DIR_ENV}={root}: no {TRACE_SET}/{filename} there; "
                f"run `gpupool traces fetch --dir {root}` where the internet is reachable"
            )
        return found
    found = _holds(cache_dir(), filename)
    if found is not None:
        return found
    raise ConfigurationError(
        f"the Alibaba GPU trace is not shipped with airflow-gpupool and is not in the cache "
        f"({cache_dir()}): run `gpupool traces fetch` to download it (from {BASE_URL}), or set "
        f"{TRACE_DIR_ENV} to a folder holding {TRACE_SET}/{filename}, or pass a CSV path; "
        "`gpupool traces synth --dir D` writes a small generated stand-in"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download(url: str, target: Path, expected: str, progress: Progress | None) -> None:
    """Download ``url`` to ``target`` through a temporary file, checking its SHA-256 on the way."""
    partial = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response, partial.open("wb") as out:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            done = 0
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if progress is not None:
                    progress(target.name, done, total)
    except (urllib.error.URLError, OSError) as e:
        partial.unlink(missing_ok=True)
        reason = getattr(e, "reason", None) or e
        raise TraceFetchError(url, f"download failed: {reason}") from e
    if digest.hexdigest() != expected:
        partial.unlink(missing_ok=True)
        raise TraceFetchError(
            url, f"SHA-256 is {digest.hexdigest()}, expected {expected}: not the pinned file"
        )
    partial.replace(target)


def fetch(
    folder: str | Path | None = None,
    *,
    base_url: str = BASE_URL,
    files: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> list[Path]:
    """Download the trace files that are missing or wrong into ``folder/alibaba-gpu-v2023/``.

    A file already there with the pinned SHA-256 is kept (no download); each download is
    written to a temporary file and moved into place only once its SHA-256 matches, so an
    interrupted or corrupted download never leaves a file the simulator would read.

    :param folder: where to put them (default: :func:`cache_dir`); usable as ``GPUPOOL_TRACE_DIR``
    :param base_url: the folder URL the files are under (tests point it at a local server)
    :param files: file name -> SHA-256 (default: :data:`FILES`)
    :param progress: called with ``(file, bytes so far, total bytes or None)`` during a download
    :return: the paths of the files, downloaded or already there
    :raises TraceFetchError: a download failed or its SHA-256 is not the pinned one
    """
    target = (Path(folder).expanduser() if folder is not None else cache_dir()) / TRACE_SET
    target.mkdir(parents=True, exist_ok=True)
    out = []
    for name, expected in (files if files is not None else FILES).items():
        path = target / name
        if not (path.is_file() and _sha256(path) == expected):
            _download(f"{base_url.rstrip('/')}/{name}", path, expected, progress)
        out.append(path)
    return out


def stderr_bar(width: int = 30) -> Progress:
    """Return a progress callback drawing ``file [#####     ]  42%  1.2 MiB`` on stderr."""

    def show(name: str, done: int, total: int | None) -> None:
        size = f"{done / 2**20:6.1f} MiB"
        if total:
            filled = int(width * done / total)
            bar = f"[{'#' * filled}{' ' * (width - filled)}] {done * 100 // total:3d}%"
        else:
            bar = "[" + " " * width + "]     "
        sys.stderr.write(f"\r{name:<34} {bar} {size}")
        if total and done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show
