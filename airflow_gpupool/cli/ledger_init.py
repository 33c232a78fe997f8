"""``gpupool ledger init``: create or migrate the ledger schema (what the migration Job runs).

A module of its own so that what the Job's command calls is this and the ledger alone: the
Job's ServiceAccount needs no Kubernetes access (``tests/integration/test_deploy_rbac.py``).
"""

from __future__ import annotations

import argparse

from airflow_gpupool.cli.common import open_ledger

__all__ = ["cmd_ledger_init"]


def cmd_ledger_init(args: argparse.Namespace) -> int:
    """Create or migrate the ledger schema."""
    ledger = open_ledger(args, must_exist=False)
    applied = ledger.migrate()
    print(
        f"ledger at {ledger.display_url}: "
        + (f"applied schema {', '.join(f'v{v}' for v in applied)}" if applied else "already up to date")
    )
    return 0
