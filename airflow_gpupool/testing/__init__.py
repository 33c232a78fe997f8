"""Test GPU DAGs without a cluster: a Kubernetes API emulator with GPU nodes and a simulated kubelet.

Quick start::

    from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node

    with KubernetesEmulatorServer(nodes=[gpu_node("gpu-a", gpus=8)]) as k8s:
        ...  # KubernetesPodOperator(config_file=k8s.kubeconfig_path, in_cluster=False, ...)

Pod behaviour is steered by ``gpupool.emulator/*`` annotations (see
:mod:`airflow_gpupool.testing.pods.behaviour`) or :meth:`KubernetesEmulatorServer.configure_pod`.
The pytest fixtures ``k8s_emulator`` and ``k8s_emulator_clean`` come with the testing kit's
(:mod:`airflow_gpupool.testkit.fixtures`, loaded by the package's ``pytest11`` entry point).
"""

from __future__ import annotations

from airflow_gpupool.labels import POOL_LABEL
from airflow_gpupool.testing.api.apiserver import KubernetesApiEmulator, RecordedRequest
from airflow_gpupool.testing.cluster.nodes import cpu_node, default_nodes, gpu_node, load_nodes
from airflow_gpupool.testing.cluster.pools import GpuPool, hami_pool, kai_pool, mig_pool, whole_gpu_pool
from airflow_gpupool.testing.cluster.provisioner import ScalableNodePool
from airflow_gpupool.testing.pods.behaviour import ANNOTATION_PREFIX, ANNOTATIONS, PodBehaviour, PodRule
from airflow_gpupool.testing.pods.checkpoints import COMPLETE_MARKER, MANIFEST_NAME, RESUME_ENV
from airflow_gpupool.testing.server import KubernetesEmulatorServer, kubeconfig, write_kubeconfig

__all__ = [
    "ANNOTATIONS",
    "ANNOTATION_PREFIX",
    "COMPLETE_MARKER",
    "GpuPool",
    "MANIFEST_NAME",
    "POOL_LABEL",
    "RESUME_ENV",
    "KubernetesApiEmulator",
    "KubernetesEmulatorServer",
    "PodBehaviour",
    "PodRule",
    "RecordedRequest",
    "ScalableNodePool",
    "cpu_node",
    "default_nodes",
    "gpu_node",
    "hami_pool",
    "kai_pool",
    "kubeconfig",
    "load_nodes",
    "mig_pool",
    "whole_gpu_pool",
    "write_kubeconfig",
]
