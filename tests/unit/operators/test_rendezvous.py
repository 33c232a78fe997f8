"""The gang Job's rendezvous environment (pure) and LeasedJobTrigger's stored schema."""

from __future__ import annotations

from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger

from airflow_gpupool.operators.gang.rendezvous import gang_hosts, rendezvous_env
from airflow_gpupool.triggers.job import LeasedJobTrigger

INDEX_PATH = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def test_rendezvous_env_names_member_zero_and_takes_rank_from_the_completion_index() -> None:
    env = {e.name: e for e in rendezvous_env("job-ddp", "ddp", 4, 29400, 2)}
    values = {name: e.value for name, e in env.items() if e.value is not None}
    assert values == {
        "MASTER_ADDR": "job-ddp-0.ddp",
        "MASTER_PORT": "29400",
        "WORLD_SIZE": "4",
        "PET_MASTER_ADDR": "job-ddp-0.ddp",
        "PET_MASTER_PORT": "29400",
        "PET_NNODES": "4",
        "PET_NPROC_PER_NODE": "2",
        "GPUPOOL_GANG_HOSTS": "job-ddp-0.ddp,job-ddp-1.ddp,job-ddp-2.ddp,job-ddp-3.ddp",
    }
    for name in ("RANK", "PET_NODE_RANK"):
        assert env[name].value is None and env[name].value_from.field_ref.field_path == INDEX_PATH


def test_a_fraction_of_a_gpu_is_still_one_process_per_member() -> None:
    env = {e.name: e.value for e in rendezvous_env("j", "s", 2, 1, 0)}
    assert env["PET_NPROC_PER_NODE"] == "1"
    assert gang_hosts("j", "s", 2) == ["j-0.s", "j-1.s"]


def test_leased_job_trigger_serializes_the_job_triggers_arguments_and_the_lease() -> None:
    job_trigger = KubernetesJobTrigger(
        job_name="job-ddp",
        job_namespace="default",
        pod_names=["job-ddp-0-abcde"],
        pod_namespace="default",
        base_container_name="base",
        config_file="/tmp/kubeconfig",
        poll_interval=0.5,
    )
    leased = LeasedJobTrigger.wrap(job_trigger, reservation_id="gp-1", ledger_conn_id=None, lease_ttl=90.0)
    classpath, kwargs = leased.serialize()
    assert classpath == "airflow_gpupool.triggers.job.LeasedJobTrigger"
    _, job_kwargs = job_trigger.serialize()
    assert kwargs == {
        **job_kwargs,
        "reservation_id": "gp-1",
        "ledger_conn_id": None,
        "ledger_url": None,
        "lease_ttl": 90.0,
        "pin_replacements": False,
    }
    assert LeasedJobTrigger(**kwargs).serialize() == (classpath, kwargs)
    pinning = LeasedJobTrigger(**{**kwargs, "pin_replacements": True})
    assert pinning.serialize()[1]["pin_replacements"] is True
