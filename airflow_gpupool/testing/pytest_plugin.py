"""Kept so that an existing ``pytest_plugins = ["airflow_gpupool.testing.pytest_plugin"]`` line still loads.

The emulator's fixtures ``k8s_emulator`` and ``k8s_emulator_clean`` now come with the testing
kit's other fixtures from the package's ``pytest11`` entry point
(:mod:`airflow_gpupool.testkit.fixtures`): no ``conftest.py`` line is needed, and this module
defines none, so a stale line does not register them twice.
"""

from __future__ import annotations
