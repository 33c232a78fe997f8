"""The cluster's pods for the commands that compare the ledger with them (``gpupool status --kubeconfig``, ``metrics serve --drift``).

A module of its own, not in :mod:`~airflow_gpupool.cli.common`: what a command's code calls is
what its deployment's RBAC must grant (``tests/integration/test_deploy_rbac.py``), and every
command imports the common helpers.
"""

from __future__ import annotations

from airflow_gpupool.cli.common import PodLister

__all__ = ["cluster_pods"]


def cluster_pods(kubeconfig: str | None, context: str | None) -> PodLister:
    """Return a function listing every pod of the cluster as JSON, page by page.

    :param kubeconfig: kubeconfig file (default: ``KUBECONFIG``, ``~/.kube/config``, in-cluster)
    :param context: kubeconfig context
    """
    from airflow_gpupool.inventory.sync import core_v1_api, list_objects

    api = core_v1_api(kubeconfig, context)
    return lambda: list(list_objects(api.list_pod_for_all_namespaces))
