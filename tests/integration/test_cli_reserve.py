"""``gpupool reserve`` through the real entry point, on SQLite and PostgreSQL (issue 38 item 3).

A reservation must ask for a GPU (``--gpus 0`` alone was granted as "GPUs []"); ``--preemptible``
lets urgent work take the slice back, ``--capacity`` chooses spot or on-demand as the operators'
``capacity`` does, and ``--priority-class`` reads a PriorityClass's value from the cluster (the
Kubernetes emulator, over HTTP) as the gatekeeper does. A refused command writes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_gpupool.cli import main
from airflow_gpupool.labels import CAPACITY_TYPE_LABEL
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.testing import KubernetesEmulatorServer
from tests.ledger_fixtures import node


@pytest.fixture
def pool(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """One on-demand node and one spot node of one GPU each; grants may be preempted at once."""
    monkeypatch.setenv("AIRFLOW__GPUPOOL__MIN_RUNTIME_SECONDS", "0")
    ledger = Ledger.create(ledger_url)
    ledger.upsert_nodes([node("od-1", gpus=1), node("spot-1", gpus=1, labels={CAPACITY_TYPE_LABEL: "spot"})])
    yield ledger
    ledger.close()


def reserve(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, Any, str]:
    """Run ``gpupool reserve ARGV --url URL --json``; return the code, the JSON printed (or None) and stderr."""
    code = main(["reserve", *argv, "--url", url, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out else None, err


def nothing_written(ledger: Ledger) -> bool:
    return ledger.history() == []


@pytest.mark.parametrize(
    "argv", [["--gpus", "0"], [], ["--gpus", "0", "--preemptible"]], ids=["zero", "none", "zero-preemptible"]
)
def test_a_reservation_without_a_gpu_is_refused(
    pool: Ledger, ledger_url: str, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, err = reserve(capsys, ledger_url, *argv)

    assert (code, out) == (2, None)
    assert err == (
        "gpupool: error: invalid --gpus=0: expected at least 1 whole GPU, or --gpu-milli or --mig-profile "
        "for a part of one\n"
    )  # refused before a reservation id is made or printed
    assert nothing_written(pool)


def test_urgent_work_takes_a_preemptible_slice_back(
    pool: Ledger, ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for rid in ("low-od", "low-spot"):
        code, out, _ = reserve(
            capsys, ledger_url, "--gpus", "1", "--preemptible", "--capacity", "any", "--id", rid
        )
        assert (code, out["state"], out["request"]["preemptible"]) == (0, "granted", True)

    code, out, _ = reserve(capsys, ledger_url, "--gpus", "1", "--priority", "100", "--id", "urgent")

    assert (code, out["state"]) == (0, "waiting")  # the victim has its grace to end first
    victim = pool.get("low-od")  # urgent work runs on on-demand: the on-demand victim is chosen
    assert victim.state is ReservationState.PREEMPTING
    assert pool.get("low-spot").state is ReservationState.GRANTED
    assert "preempted for urgent" in (victim.message or "")


def test_without_preemptible_the_slice_is_kept(
    pool: Ledger, ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for rid in ("keep-od", "keep-spot"):
        assert reserve(capsys, ledger_url, "--gpus", "1", "--capacity", "any", "--id", rid)[0] == 0

    code, out, _ = reserve(capsys, ledger_url, "--gpus", "1", "--priority", "100", "--id", "urgent")

    assert (code, out["state"]) == (0, "waiting")
    assert {pool.get(rid).state for rid in ("keep-od", "keep-spot")} == {ReservationState.GRANTED}


@pytest.mark.parametrize(
    ("argv", "landed"),
    [
        (["--capacity", "spot"], "spot-1"),
        (["--capacity", "on-demand"], "od-1"),
        (["--priority", "100"], "od-1"),  # the operators' default rule: urgent work on on-demand
    ],
    ids=["spot", "on-demand", "urgent-default"],
)
def test_capacity_chooses_spot_or_on_demand(
    pool: Ledger, ledger_url: str, capsys: pytest.CaptureFixture[str], argv: list[str], landed: str
) -> None:
    code, out, _ = reserve(capsys, ledger_url, "--gpus", "1", *argv)

    assert (code, out["grant"]["node"]) == (0, landed)


def test_capacity_spot_waits_for_spot(
    pool: Ledger, ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert reserve(capsys, ledger_url, "--gpus", "1", "--capacity", "spot", "--id", "first")[0] == 0

    code, out, _ = reserve(capsys, ledger_url, "--gpus", "1", "--capacity", "spot", "--id", "second")

    assert (code, out["state"]) == (0, "waiting")  # od-1 is free, but not spot
    assert "od-1: node is on-demand capacity, the request needs spot" in pool.explain("second")


@pytest.mark.parametrize(
    "argv",
    [["--capacity", "cheap"], ["--priority", "5", "--priority-class", "team-high"], ["--priority-class", ""]],
    ids=["unknown-capacity", "priority-and-class", "empty-class"],
)
def test_bad_options_are_refused_by_the_parser(
    pool: Ledger, ledger_url: str, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["reserve", "--gpus", "1", *argv, "--url", ledger_url])

    assert refused.value.code == 2
    assert "reserve: error: argument --" in capsys.readouterr().err
    assert nothing_written(pool)


def test_priority_class_takes_the_classs_value(
    pool: Ledger,
    ledger_url: str,
    capsys: pytest.CaptureFixture[str],
    k8s: KubernetesEmulatorServer,
    core: Any,
) -> None:
    from kubernetes import client

    client.SchedulingV1Api(core.api_client).create_priority_class(
        client.V1PriorityClass(metadata=client.V1ObjectMeta(name="team-high"), value=500)
    )
    kubeconfig = ("--kubeconfig", k8s.kubeconfig_path)

    code, out, _ = reserve(capsys, ledger_url, "--gpus", "1", "--priority-class", "team-high", *kubeconfig)
    assert (code, out["request"]["priority"]) == (0, 500)

    code, out, err = reserve(capsys, ledger_url, "--gpus", "1", "--priority-class", "no-such", *kubeconfig)
    assert (code, out) == (2, None)
    assert "invalid --priority-class='no-such': expected a PriorityClass of the cluster with a value" in err
    assert "PriorityClass 'no-such' does not exist" in err

    code, out, err = reserve(
        capsys, ledger_url, "--gpus", "1", "--priority-class", "gpupool-training", *kubeconfig
    )
    assert (code, out) == (2, None)
    assert "which order pods for the kube-scheduler and give no ledger priority; use --priority" in err
    assert len(pool.history()) == 1  # only the first was written


def test_priority_class_names_an_unreachable_cluster(
    pool: Ledger, ledger_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "no-kubeconfig"

    code, out, err = reserve(
        capsys, ledger_url, "--gpus", "1", "--priority-class", "x", "--kubeconfig", str(missing)
    )

    assert (code, out) == (2, None)
    assert err.startswith(f"gpupool: error: --priority-class needs the cluster; --kubeconfig {missing}: ")
    assert "Traceback" not in err
    assert nothing_written(pool)
