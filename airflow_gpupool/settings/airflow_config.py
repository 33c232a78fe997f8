"""Airflow's own configuration as the provider reads it: ``AIRFLOW_HOME`` and the executors.

Outside Airflow (the CLI, benchmark clients) importing Airflow costs seconds, so ``airflow.cfg``
is read directly there; inside it, Airflow's ``conf`` is asked.
"""

from __future__ import annotations

import configparser
import os
import sys
from pathlib import Path

from airflow_gpupool.exceptions import ConfigurationError

__all__ = ["LOCAL_EXECUTORS", "airflow_home", "executors", "read_airflow_cfg"]


def airflow_home() -> Path:
    """Return ``AIRFLOW_HOME`` (default ``~/airflow``)."""
    return Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser()


#: Executors that run every task on the one machine (a SQLite ledger file is then shared).
LOCAL_EXECUTORS = frozenset({"LocalExecutor", "SequentialExecutor", "DebugExecutor"})


def executors() -> tuple[str, ...]:
    """Return the class names of the configured executors (``[core] executor``, comma-separated).

    Module paths and team prefixes (``team:executor``) are reduced to the class name.
    """
    raw = os.environ.get("AIRFLOW__CORE__EXECUTOR")
    if raw is None:
        if "airflow.configuration" in sys.modules:
            from airflow.configuration import conf

            raw = conf.get("core", "executor", fallback="LocalExecutor")
        else:
            raw = _airflow_cfg_option("core", "executor") or "LocalExecutor"
    names = (item.strip().rpartition(":")[2].rpartition(".")[2] for item in str(raw).split(","))
    return tuple(n for n in names if n) or ("LocalExecutor",)


def _airflow_cfg_option(section: str, option: str) -> str | None:
    return read_airflow_cfg().get(section, option, fallback=None)


def read_airflow_cfg() -> configparser.ConfigParser:
    """Return Airflow's configuration file as written (``AIRFLOW_CONFIG``, else ``airflow.cfg`` in ``AIRFLOW_HOME``).

    Read without Airflow, whose import costs seconds; a missing file reads as empty.

    :raises ConfigurationError: the file is not a valid configuration file
    """
    path = Path(os.environ.get("AIRFLOW_CONFIG", airflow_home() / "airflow.cfg")).expanduser()
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path)
    except configparser.Error as e:
        raise ConfigurationError(f"{path} is not a valid Airflow configuration file: {e}") from e
    return parser
