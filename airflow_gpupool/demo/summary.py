"""The summary `make demo` prints: each task's outcome, each grant the ledger made, what was left behind."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

from airflow_gpupool.executor_hook import GATEKEEPER_HOST
from airflow_gpupool.labels import SCHEDULING_GATE
from airflow_gpupool.ledger import Grant, Ledger, Reservation
from airflow_gpupool.task_try import TaskTry
from airflow_gpupool.testing import KubernetesEmulatorServer

__all__ = ["grant_lines", "legacy_line", "node_health_line", "summarize", "task_lines"]

DAG_ID = "gpu_retraining"
#: The DAG that knows nothing of gpupool: the executor hook gates its pod, the gatekeeper admits it.
LEGACY_DAG_ID = "legacy_gpu_pod"


def _slice(grant: Grant) -> str:
    if grant.mig_slice:
        return f"MIG {grant.mig_profile} slice {grant.mig_slice}"
    gpus = ",".join(map(str, grant.gpu_indices))
    if grant.milli_per_gpu < 1000:
        return f"GPU {gpus}: {grant.milli_per_gpu} milli-GPU, {grant.gpu_memory_mib} MiB"
    return f"GPU {gpus} ({grant.gpu_model})"


def _task_of(holder: str) -> str:
    task = TaskTry.from_holder(holder)
    return f"{task.task_id} try {task.try_number}" if task is not None else holder


def grant_lines(ledger: Ledger) -> list[str]:
    """Return one line per grant the ledger made, oldest first: task, node, slice, seconds held.

    :param ledger: the ledger
    """
    lines = []
    granted: list[Reservation] = [r for r in reversed(ledger.history(limit=1000)) if r.grant is not None]
    for r in granted:
        assert r.grant is not None
        end = r.ended_at
        held = f"{end - r.grant.granted_at:6.1f} s" if end is not None else "  still held"
        gated = (
            "  (gated pod, admitted by the gatekeeper)" if r.holder.endswith(f"@{GATEKEEPER_HOST}") else ""
        )
        lines.append(
            f"  {_task_of(r.holder):<22} {r.grant.node:<11} {_slice(r.grant):<44} {held}  {r.state.value}{gated}"
        )
    return lines


def _env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}


def _train_note(dag_run: Any, ti: Any, ledger: Ledger, k8s: KubernetesEmulatorServer) -> str:
    from airflow_gpupool.ledger import TaskAttempts

    notes = []
    for attempt in TaskAttempts(ledger).history(TaskTry(DAG_ID, "train", dag_run.run_id).task_key):
        notes.append(
            f"try {attempt.try_number} failed ({attempt.failure_class}, exit {attempt.exit_code}) "
            f"after checkpoint step {attempt.checkpoint_step}"
        )
    resumed = [
        _env_of(p)["GPUPOOL_RESUME_FROM"]
        for p in k8s.created_pods()
        if p["metadata"]["name"].startswith("train") and "GPUPOOL_RESUME_FROM" in _env_of(p)
    ]
    for where in resumed:
        notes.append(f"retry resumed from checkpoint step {int(where.rstrip('/').rsplit('-', 1)[1])}")
    return "; ".join(notes)


def task_lines(dag_run: Any, ledger: Ledger, k8s: KubernetesEmulatorServer) -> list[str]:
    """Return one line per task: its outcome, tries, and what happened.

    :param dag_run: the finished DagRun
    :param ledger: the ledger
    :param k8s: the emulator
    """
    order = ["prepare_data", "train", "watch_checkpoints", "evaluate", "decide", "promote", "keep_current"]
    tis = sorted(
        dag_run.get_task_instances(), key=lambda ti: order.index(ti.task_id) if ti.task_id in order else 99
    )
    lines = []
    for ti in tis:
        note = ""
        if ti.task_id == "train":
            note = _train_note(dag_run, ti, ledger, k8s)
        elif ti.task_id == "watch_checkpoints":
            manifest = ti.xcom_pull(task_ids=ti.task_id) or {}
            if manifest:
                note = f"final checkpoint step {manifest['step']}, loss {manifest['metrics'].get('loss')}"
        elif ti.task_id == "decide":
            chosen = [
                t.task_id
                for t in tis
                if t.task_id in ("promote", "keep_current") and str(t.state) != "skipped"
            ]
            note = f"chose {', '.join(chosen) or 'nothing'} (final loss vs the current_loss param)"
        tries = ti.try_number if str(ti.state) != "skipped" else 0
        took = f"{ti.duration:5.1f} s" if ti.duration is not None else "      -"
        lines.append(f"  {ti.task_id:<18} {str(ti.state):<8} {tries:>5}  {took}   {note}".rstrip())
    return lines


NEXT_STEPS = """\
Next:
  make ui        the Airflow UI (airflow standalone) with the emulator and the example DAGs:
                 http://localhost:8080 (the admin password is printed by airflow standalone)
  Real cluster:  KUBECONFIG=~/.kube/config (or run in-cluster), unset GPUPOOL_EMULATOR, and
                 `gpupool inventory sync --url URL` to load its GPU nodes into the ledger.
  PostgreSQL:    AIRFLOW_CONN_GPUPOOL_DEFAULT='{"conn_type": "gpupool", "extra":
                 {"ledger_url": "postgresql://gpupool@db:5432/gpupool"}}' (see docker/compose.yaml),
                 after `gpupool ledger init --url postgresql://...` creates it.
"""


def legacy_line(dag_run: Any, k8s: KubernetesEmulatorServer) -> str:
    """Return the plain KubernetesPodOperator task's line: its outcome, and how its pod was gated and admitted.

    :param dag_run: the finished ``legacy_gpu_pod`` DagRun
    :param k8s: the emulator
    """
    (ti,) = dag_run.get_task_instances()
    pods = [p for p in k8s.created_pods() if p["metadata"]["name"].startswith("embed-catalog")]
    gated = [
        p for p in pods if any(g["name"] == SCHEDULING_GATE for g in p["spec"].get("schedulingGates") or [])
    ]
    nodes = {k8s.pod_history(p["metadata"]["name"])[-1]["spec"].get("nodeName") for p in gated}
    note = (
        f"created gated ({SCHEDULING_GATE}), admitted by the gatekeeper onto {', '.join(sorted(map(str, nodes)))}"
        if gated
        else "its pod was not gated: the executor hook did not run"
    )
    took = f"{ti.duration:5.1f} s" if ti.duration is not None else "      -"
    return f"  {ti.task_id:<18} {str(ti.state):<8} {ti.try_number:>5}  {took}   {note}"


def summarize(
    dag_runs: list[Any],
    ledger: Ledger,
    k8s: KubernetesEmulatorServer,
    workdir: Path,
    seconds: float,
    out: IO[str],
) -> bool:
    """Print the summary; return whether the runs succeeded and left nothing behind.

    :param dag_runs: the finished DagRuns of ``gpu_retraining`` and ``legacy_gpu_pod``
    :param ledger: the ledger
    :param k8s: the emulator
    :param workdir: the demo's directory
    :param seconds: how long the DAG runs took
    :param out: where to print
    """
    dag_run, legacy = dag_runs
    snap = ledger.snapshot()
    violations = ledger.check_invariants()
    p = out.write
    p(
        f"\nDAG {DAG_ID}, run {dag_run.run_id}: {dag_run.state}; DAG {LEGACY_DAG_ID}: {legacy.state}; {seconds:.1f} s\n"
    )
    p(f"  {'task':<18} {'outcome':<8} {'tries':>5}  {'time':>7}   notes\n")
    p("\n".join(task_lines(dag_run, ledger, k8s)) + "\n")
    p(f"  {LEGACY_DAG_ID} (a plain KubernetesPodOperator, nvidia.com/gpu: 1, no gpupool argument):\n")
    p(legacy_line(legacy, k8s) + "\n")
    p("  (the first task's time includes starting Airflow's in-process task API)\n")
    p("\nGrants made (ledger history, oldest first)\n")
    p(f"  {'task':<22} {'node':<11} {'GPUs or slice':<44} {'held':>8}  final state\n")
    p("\n".join(grant_lines(ledger)) + "\n")
    p(
        f"\ngrants leaked: {len(snap.grants)}   (queue {len(snap.queue)}, invariant violations {len(violations)})\n"
    )
    p(node_health_line(snap) + "\n")
    p(f"Checkpoints under {workdir / 'checkpoints'}; Airflow's log in {workdir / 'demo.log'}\n\n")
    p(NEXT_STEPS)
    succeeded = all(str(r.state) == "success" for r in dag_runs)
    return succeeded and not snap.grants and not snap.queue and not violations


def node_health_line(snap: Any) -> str:
    """Say how the nodes' agents stand: reporting, quarantined (nodes and GPUs), leaks."""
    reporting = sum(1 for n in snap.nodes if n.heartbeat_at is not None)
    nodes_out = sum(1 for n in snap.nodes if n.health == "quarantined")
    gpus_out = sum(1 for n in snap.nodes for g in n.gpus if g.get("health") == "quarantined")
    leaks = sum(1 for n in snap.nodes for g in n.gpus if g.get("leak"))
    verified = sum(1 for n in snap.nodes for g in n.gpus if g.get("uuid_verified"))
    total = sum(len(n.gpus) for n in snap.nodes)
    return (
        f"node agents: {reporting} of {len(snap.nodes)} nodes reporting, {verified} of {total} GPU UUIDs verified; "
        f"quarantined: {nodes_out} nodes, {gpus_out} GPUs; GPU memory leaks: {leaks}"
    )
