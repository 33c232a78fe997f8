"""A throw-away PostgreSQL cluster that tests may stop and start: never the shared server.

``initdb`` refuses to run as root, so as root the cluster belongs to the ``postgres`` user.
Without ``/usr/lib/postgresql/*/bin/initdb`` the tests that need it skip (fail under CI).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.skips import skip_or_fail


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThrowawayCluster:
    """A PostgreSQL cluster in a temporary directory, on a port of its own."""

    def __init__(self, bin_dir: Path, root: Path) -> None:
        self.bin_dir = bin_dir
        self.root = root
        self.data = root / "data"
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["su", "postgres", "-c", subprocess.list2cmdline(command)]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: sessions are ended, as on an admin shutdown)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")


@pytest.fixture(scope="session")
def throwaway_pg() -> Iterator[ThrowawayCluster]:
    """A running throw-away cluster for the session; stopped and removed afterwards."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        skip_or_fail("no /usr/lib/postgresql/*/bin/initdb here", what="the PostgreSQL fault tests")
    root = Path(tempfile.mkdtemp(prefix="gpupool-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    cluster = ThrowawayCluster(bin_dir, root)
    cluster.init()
    cluster.start()
    try:
        yield cluster
    finally:
        try:
            cluster.stop("immediate")
        except subprocess.CalledProcessError:
            pass  # already stopped by the test
        shutil.rmtree(root, ignore_errors=True)
