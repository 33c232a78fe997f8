"""Keep the testing kit's Airflow files out of the user's ``~/airflow``.

Airflow reads ``AIRFLOW_HOME`` once, when :mod:`airflow.configuration` is first imported, and
writes ``airflow.cfg`` and the SQLite metadata database there (``~/airflow`` when it is unset).
A test run must leave a developer's own Airflow alone, so the kit points ``AIRFLOW_HOME`` at a
temporary directory for the session, unless the user set it (then theirs is respected). It has
to happen before anything imports Airflow: the kit's pytest plugin does it in
``pytest_load_initial_conftests``, which pytest calls for entry-point plugins before it reads
any ``conftest.py`` or test module. Outside pytest, call :func:`isolate_airflow_home` first.

Under pytest-xdist, each worker inherits the controller's environment, and with it the kit's
home: workers sharing one SQLite metadata database lock each other out, so a worker given the
kit's own temporary home makes one of its own (a home the user set is still shared).

Standard library only: the plugin imports this module in every pytest run of the environment.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

PREFIX = "gpupool-airflow-home-"
#: Set to the kit's temporary home, so that a pytest-xdist worker can tell it from the user's own.
KIT_HOME_VARIABLE = "GPUPOOL_KIT_AIRFLOW_HOME"


class AirflowHomeWarning(UserWarning):
    """Airflow was imported before the kit could isolate ``AIRFLOW_HOME``: it uses ``~/airflow``."""


@dataclass(frozen=True)
class AirflowHome:
    """The ``AIRFLOW_HOME`` of a kit session.

    :param path: the directory Airflow uses
    :param temporary: the kit made it (and :meth:`close` removes it); ``False`` for the user's own
    """

    path: Path
    temporary: bool

    def close(self) -> None:
        """Remove a temporary home and unset ``AIRFLOW_HOME`` again; leave the user's own alone."""
        if not self.temporary:
            return
        for variable in ("AIRFLOW_HOME", KIT_HOME_VARIABLE):
            if os.environ.get(variable) == str(self.path):
                del os.environ[variable]
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> AirflowHome:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def isolate_airflow_home() -> AirflowHome:
    """Point ``AIRFLOW_HOME`` at a new temporary directory unless the user set it; return it.

    Call it before anything imports Airflow, and :meth:`AirflowHome.close` at the end (or use it
    as a context manager). If Airflow is already imported without ``AIRFLOW_HOME``, it has chosen
    ``~/airflow`` for good: the home is reported as that, with an :class:`AirflowHomeWarning`.
    """
    chosen = os.environ.get("AIRFLOW_HOME")
    inherited_from_kit = chosen and chosen == os.environ.get(KIT_HOME_VARIABLE)
    if chosen and not (inherited_from_kit and os.environ.get("PYTEST_XDIST_WORKER")):
        return AirflowHome(Path(chosen), temporary=False)
    if "airflow.configuration" in sys.modules:
        # Setting the variable now would split the process: Airflow's config keeps ~/airflow while
        # the subprocesses the kit starts (airflow db migrate) would use the new directory.
        from airflow.configuration import AIRFLOW_HOME  # already imported: costs nothing

        warnings.warn(
            f"Airflow was imported before the gpupool testing kit could isolate AIRFLOW_HOME, so it "
            f"writes to {AIRFLOW_HOME}; set AIRFLOW_HOME, or import Airflow only inside tests",
            AirflowHomeWarning,
            stacklevel=2,
        )
        return AirflowHome(Path(AIRFLOW_HOME), temporary=False)
    path = Path(tempfile.mkdtemp(prefix=PREFIX))
    os.environ["AIRFLOW_HOME"] = os.environ[KIT_HOME_VARIABLE] = str(path)
    return AirflowHome(path, temporary=True)
