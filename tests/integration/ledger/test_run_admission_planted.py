"""The ledger's state machine fails when run admission is broken: a planted break.

With :meth:`RunGate.waits` always False (a run's first step passes its gate), the machine's check
that a run's first step is granted only with its run's peak free must fail.

The machine's own rules are called in a fixed order rather than found by a random search: a search
with a fixed seed found the break at its 85th example run alone and none within 150 in a CI run
(in one process, what ran before it changes the sequences it draws: after
``test_connection_refused.py``, none in 159), so a search cannot show reliably that the check
works. The same sequence passes with the gate intact, so it is the gate that the check catches.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_gpupool.ledger.teams.run_gate import RunGate
from airflow_gpupool.resources import GpuRequest
from tests.integration.ledger.test_ledger_properties import Database, LedgerMachine


def _a_run_whose_peak_is_not_free(tmp_path: Path) -> None:
    """Two GPUs held, then a 1-GPU first step of a run that needs 4 at once (the pool has 5)."""
    machine = type("LedgerMachine_sqlite", (LedgerMachine,), {"database": Database("sqlite", tmp_path)})()
    try:
        machine.load_inventory()
        machine.reserve(batch=[GpuRequest(gpus=2)], ttl=600, timeout=900)
        machine.reserve_run_entry(request=GpuRequest(gpus=1), extra=3000)
        machine.ledger_is_consistent()
    finally:
        machine.teardown()


def test_the_sequence_passes_with_the_run_gate_intact(tmp_path: Path) -> None:
    _a_run_whose_peak_is_not_free(tmp_path)


def test_the_state_machine_finds_a_first_step_granted_without_its_peak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(RunGate, "waits", lambda self, tx, entry, quota: False)
    with pytest.raises(AssertionError, match="granted while its run's peak"):
        _a_run_whose_peak_is_not_free(tmp_path)
