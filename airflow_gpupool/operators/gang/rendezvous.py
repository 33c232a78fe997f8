"""The rendezvous environment of a gang Job: how its members find each other (pure).

Every pod of an Indexed Job gets the hostname ``<job>-<index>`` in the template's subdomain, so
member 0 is reachable at ``<job>-0.<subdomain>`` once a headless Service of that name selects the
Job's pods (``batch.kubernetes.io/job-name=<job>``). The variables follow what the launchers read:

* PyTorch (``torch.distributed``): ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``;
* ``torchrun``: ``PET_NNODES``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``,
  ``PET_NPROC_PER_NODE`` (torchrun reads ``PET_<OPTION>`` for each option not given);
* Horovod elastic: ``horovodrun`` runs on member 0 (``RANK=0``) with ``--host-discovery-script``
  printing ``<job>-<i>.<subdomain>:<slots>`` for each member, ``GPUPOOL_GANG_HOSTS`` lists them.

``RANK`` and ``PET_NODE_RANK`` are the completion index, read through the downward API from the
annotation the Job controller sets, so one template serves every member.
"""

from __future__ import annotations

from kubernetes.client import models as k8s

from airflow_gpupool.labels import COMPLETION_INDEX_ANNOTATION

__all__ = ["COMPLETION_INDEX_ANNOTATION", "DEFAULT_RENDEZVOUS_PORT", "gang_hosts", "rendezvous_env"]

DEFAULT_RENDEZVOUS_PORT = 29500


def gang_hosts(job_name: str, subdomain: str, members: int) -> list[str]:
    """Return the members' host names, by rank.

    :param job_name: the Job's name
    :param subdomain: the pods' subdomain (the headless Service's name)
    :param members: how many members
    """
    return [f"{job_name}-{i}.{subdomain}" for i in range(members)]


def rendezvous_env(
    job_name: str, subdomain: str, members: int, port: int, procs_per_member: int
) -> list[k8s.V1EnvVar]:
    """Return the rendezvous variables of every member's main container.

    :param job_name: the Job's name
    :param subdomain: the pods' subdomain
    :param members: the world's size in members (nodes, for torchrun)
    :param port: member 0's rendezvous port
    :param procs_per_member: processes per member (its GPUs; at least 1)
    """
    hosts = gang_hosts(job_name, subdomain, members)
    rank = k8s.V1EnvVarSource(
        field_ref=k8s.V1ObjectFieldSelector(
            field_path=f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"
        )
    )
    plain = {
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(members),
        "PET_MASTER_ADDR": hosts[0],
        "PET_MASTER_PORT": str(port),
        "PET_NNODES": str(members),
        "PET_NPROC_PER_NODE": str(max(1, procs_per_member)),
        "GPUPOOL_GANG_HOSTS": ",".join(hosts),
    }
    env = [k8s.V1EnvVar(name=name, value=value) for name, value in plain.items()]
    env += [k8s.V1EnvVar(name=name, value_from=rank) for name in ("RANK", "PET_NODE_RANK")]
    return env
