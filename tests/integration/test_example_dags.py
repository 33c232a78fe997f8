"""The example DAGs in ``dags/``: they import fast with no I/O, and each runs green under dag.test()."""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_gpupool.checkpoints import CheckpointStore
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.testing import KubernetesEmulatorServer

DAGS = Path(__file__).resolve().parents[2] / "dags"
EXAMPLES = sorted(p.name for p in DAGS.glob("*.py"))
A100 = "NVIDIA-A100-SXM4-80GB"


def ti_of(dag_run: Any, task_id: str) -> Any:
    return next(ti for ti in dag_run.get_task_instances() if ti.task_id == task_id)


def states(dag_run: Any) -> dict[str, str]:
    return {f"{ti.task_id}[{ti.map_index}]": str(ti.state) for ti in dag_run.get_task_instances()}


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}


def assert_nothing_held(ledger: Ledger) -> None:
    snap = ledger.snapshot()
    assert snap.grants == () and snap.queue == ()
    assert ledger.check_invariants() == []


def _no_io(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("I/O while parsing a DAG file")


@pytest.mark.parametrize("filename", EXAMPLES)
def test_example_imports_fast_without_io(
    filename: str, airflow_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_gpupool.testing.dagbag import dag_bag_class

    DagBag = dag_bag_class()
    from kubernetes import config as k8s_config

    import airflow_gpupool.operators
    import airflow_gpupool.sensors  # noqa: F401 (warm: the time limit is for the file, not the provider)

    monkeypatch.setattr(Ledger, "__init__", _no_io)
    monkeypatch.setattr(k8s_config, "load_kube_config", _no_io)
    monkeypatch.setattr(k8s_config, "load_incluster_config", _no_io)
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")  # a real path would not be read either

    started = time.perf_counter()
    bag = DagBag(str(DAGS / filename))
    elapsed = time.perf_counter() - started

    assert bag.import_errors == {}
    assert bag.dag_ids, f"{filename} defines no DAG"
    assert elapsed < 1.0, f"{filename} took {elapsed:.2f} s to parse"


def test_gpu_retraining_resumes_from_its_checkpoint_and_promotes(
    run_dag, k8s: KubernetesEmulatorServer, gpu_ledger: Ledger
) -> None:
    dag_run = run_dag("gpu_retraining")

    assert str(dag_run.state) == "success", states(dag_run)
    assert states(dag_run) == {
        "prepare_data[-1]": "success",
        "train[-1]": "success",
        "watch_checkpoints[-1]": "success",
        "evaluate[-1]": "success",
        "decide[-1]": "success",
        "promote[-1]": "success",
        "keep_current[-1]": "skipped",
    }
    assert ti_of(dag_run, "train").try_number == 2
    trains = [p for p in k8s.created_pods() if p["metadata"]["name"].startswith("train")]
    assert len(trains) == 2
    assert env_of(trains[1])["GPUPOOL_RESUME_FROM"].endswith("step-000003")
    manifest = ti_of(dag_run, "watch_checkpoints").xcom_pull(task_ids="watch_checkpoints")
    assert manifest["step"] == 5 and manifest["metrics"]["loss"] < 0.5
    evaluate = next(p for p in k8s.created_pods() if p["metadata"]["name"].startswith("evaluate"))
    assert evaluate["spec"]["containers"][0]["command"][-1] == manifest["location"]
    assert_nothing_held(gpu_ledger)


def test_gpu_sweep_runs_each_trial_on_a_fraction_and_picks_the_lowest_loss(
    run_dag, k8s: KubernetesEmulatorServer, gpu_ledger: Ledger
) -> None:
    dag_run = run_dag("gpu_sweep")

    assert str(dag_run.state) == "success", states(dag_run)
    trials = k8s.created_pods()
    assert sorted(env_of(p)["LR"] for p in trials) == ["0.001", "0.01", "0.1"]
    assert {env_of(p)["GPUPOOL_GPU_MILLI"] for p in trials} == {"250"}
    best = ti_of(dag_run, "pick_best").xcom_pull(task_ids="pick_best")
    assert (best["trial"], best["lr"], best["epochs"]) == (1, "0.01", "4")
    root = Path(os.environ["AIRFLOW_HOME"]) / "checkpoints" / "gpu_sweep" / dag_run.run_id
    assert CheckpointStore(str(root / "trial-1")).newest().step == 4  # type: ignore[union-attr]
    assert_nothing_held(gpu_ledger)


def test_inference_refresh_runs_on_a_mig_slice_with_the_inference_priority_class(
    run_dag, k8s: KubernetesEmulatorServer, gpu_ledger: Ledger
) -> None:
    dag_run = run_dag("inference_refresh")

    assert str(dag_run.state) == "success", states(dag_run)
    (pod,) = k8s.created_pods()
    assert pod["spec"]["priorityClassName"] == "gpupool-inference"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    (reservation,) = gpu_ledger.history()
    assert reservation.request.workload_class.value == "inference"
    assert reservation.grant is not None and reservation.grant.node == "gpu-mig"
    assert_nothing_held(gpu_ledger)


def test_inference_refresh_runs_without_a_logical_date(
    dagbag: Any, k8s: KubernetesEmulatorServer, gpu_ledger: Ledger
) -> None:
    # Triggered from the UI or the REST API with no logical date (Airflow 3): no data interval.
    dag_run = dagbag.get_dag("inference_refresh").test(logical_date=None)

    assert dag_run.logical_date is None
    assert str(dag_run.state) == "success", states(dag_run)
    (pod,) = k8s.created_pods()
    since = pod["spec"]["containers"][0]["command"][-1]
    assert since == (dag_run.run_after - datetime.timedelta(hours=1)).isoformat()
    assert_nothing_held(gpu_ledger)


def test_gpu_retraining_runs_without_a_logical_date(
    dagbag: Any, k8s: KubernetesEmulatorServer, gpu_ledger: Ledger
) -> None:
    dag_run = dagbag.get_dag("gpu_retraining").test(logical_date=None)

    assert dag_run.logical_date is None
    assert str(dag_run.state) == "success", states(dag_run)
    prepare = next(p for p in k8s.created_pods() if p["metadata"]["name"].startswith("prepare"))
    assert (
        prepare["spec"]["containers"][0]["command"][-1]
        == f"s3://datasets/recsys/{dag_run.run_after:%Y-%m-%d}"
    )
    assert_nothing_held(gpu_ledger)


def test_distributed_training_runs_a_gang_of_three_pinned_pods(
    run_dag, k8s: KubernetesEmulatorServer, gpu_ledger: Ledger
) -> None:
    dag_run = run_dag("distributed_training")

    assert str(dag_run.state) == "success", states(dag_run)
    (job,) = k8s.jobs("default")
    assert job["status"]["succeeded"] == 3
    leader = job["spec"]["template"]["metadata"]["annotations"]["gpupool.io/gang-reservation"]
    gang = gpu_ledger.gang(leader)
    assert [m.state.value for m in gang.members] == ["released"] * 3
    pinned = [r for r in k8s.requests if r.method == "PATCH" and "/pods/" in r.path]
    assert len(pinned) == 3  # one pin per member, each ungating its pod
    members = set()
    for request in pinned:
        ops = {op["path"]: op for op in request.body}
        # The template names the leader: its own pod's pin does not write that key again.
        members.add(patched_key(ops, "/metadata/annotations", "gpupool.io/reservation-id", leader))
        assert ops["/spec/schedulingGates"]["op"] == "remove"
        assert patched_key(ops, "/spec/nodeSelector", "kubernetes.io/hostname") == "gpu-a100"
    assert members == {m.id for m in gang.members}
    assert ti_of(dag_run, "report").xcom_pull(task_ids="report") == {
        "job": job["metadata"]["name"],
        "succeeded": 3,
        "world_size": 3,
    }
    assert_nothing_held(gpu_ledger)


def patched_key(ops: dict[str, Any], path: str, key: str, unchanged: Any = None) -> Any:
    """Return the value a JSON patch sets for ``key`` under ``path`` (the whole map added, or the one
    key), or ``unchanged`` when it leaves the key alone."""
    whole = ops.get(path)
    if whole is not None:
        return whole["value"][key]
    one = ops.get(f"{path}/{key.replace('~', '~0').replace('/', '~1')}")
    return unchanged if one is None else one["value"]
