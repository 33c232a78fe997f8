"""airflow-gpupool: a GPU-sharing layer for Apache Airflow."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

# One version source: pyproject.toml's [project] version, read from the installed distribution's
# metadata (get_provider_info and the emulator's /version read it here).
try:
    __version__ = version("airflow-gpupool")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
