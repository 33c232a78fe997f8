"""``gpupool bench queue`` runs its waiters, clients and wake-ups to the end (a smoke run, not a benchmark).

The bench once waited forever for its triggers to enter a wait room of another ledger object; a
short run here catches a hang like that one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_gpupool.cli import main


def test_bench_queue_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    code = main(
        [
            "bench",
            "queue",
            "--url",
            url,
            "--waiters",
            "20",
            "--clients",
            "1",
            "--seconds",
            "2",
            "--nodes",
            "4",
            "--min-wakeups",
            "3",
            "--json",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["backend"], result["waiters"], result["clients"]) == ("sqlite", 20, 1)
    assert result["cycles"] > 0 and result["violations"] == 0
    # Under load the 2 s window may end before a grant's poll comes round: the bench goes on
    # freeing nodes until 3 waiters were woken (at most 120 s), so fewer means wake-ups are broken.
    assert result["wakeups"] >= 3 and result["wakeup_p50_ms"] is not None
    assert 1.0 <= result["wakeup_wait_s"] < 120


def test_bench_queue_turns_nodes_over_without_waiters_as_with_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The run the ratio divides by frees nodes and takes them with whole-node tasks at the same
    # rate: what it leaves out is the waiting requests alone.
    url = f"sqlite:///{tmp_path / 'turnover.db'}"
    args = ["bench", "queue", "--url", url, "--waiters", "0", "--clients", "1", "--seconds", "2"]
    assert main([*args, "--nodes", "4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["cycles"] > 0 and result["violations"] == 0 and result["wakeups"] == 0
    assert result["nodes_turned_over"] >= 2  # four a second for about 2 s, on a loaded machine


def test_bench_queue_baseline_interleaves_a_run_without_waiters_on_a_second_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'paired.db'}"
    args = ["bench", "queue", "--url", url, "--waiters", "10", "--clients", "1", "--seconds", "2"]
    assert main([*args, "--nodes", "4", "--baseline", "--phase-s", "0.5", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (tmp_path / "paired-baseline.db").exists()  # the baseline's own ledger, beside the first
    assert result["violations"] == 0  # both ledgers checked
    assert result["phase_s"] == 0.5
    # Each run measured for its 2 s (warm-up phases not counted), cycles on both.
    assert 2.0 <= result["seconds"] < 3.0
    assert result["cycles"] > 0 and result["baseline_cycles_per_s"] > 0
    assert result["ratio"] == pytest.approx(
        result["cycles_per_s"] / result["baseline_cycles_per_s"], rel=0.01
    )
    assert result["nodes_turned_over"] >= 2 and result["baseline_nodes_turned_over"] >= 2


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--waiters", "-1"),
        ("--clients", "0"),
        ("--seconds", "0"),
        ("--nodes", "0"),
        ("--min-wakeups", "-1"),
        ("--phase-s", "0"),
    ],
)
def test_bench_queue_refuses_out_of_range_arguments(
    tmp_path: Path, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "queue", "--url", f"sqlite:///{tmp_path / 'q.db'}", flag, value])
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "q.db").exists()


def test_bench_queue_refuses_min_wakeups_without_waiters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    code = main(["bench", "queue", "--url", url, "--waiters", "0", "--min-wakeups", "1"])
    assert code == 2
    assert "--min-wakeups needs --waiters > 0" in capsys.readouterr().err
    assert not (tmp_path / "q.db").exists()
