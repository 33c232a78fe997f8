"""The testing kit in one object: an emulated GPU cluster, its ledger, and the connections ``dag.test()`` reads.

:class:`GpuCluster` puts the nodes of some :class:`~airflow_gpupool.testing.cluster.pools.GpuPool` (or
plain Node objects) into the Kubernetes emulator, syncs them into the ledger through the real
inventory sync (what the controller does), and sets the environment a DAG run reads:

* ``AIRFLOW_CONN_GPUPOOL_DEFAULT``: the ledger, a fast poll, and each pool's binding
  (``node_pool_bindings``), so ``GpuPodOperator`` needs no arguments about the cluster;
* ``AIRFLOW_CONN_KUBERNETES_DEFAULT`` and ``KUBECONFIG``: the emulator.

The pytest fixtures ``gpu_cluster`` and ``gpupool_ledger``
(:mod:`~airflow_gpupool.testkit.fixtures`) build it per test.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from airflow_gpupool.testing.cluster.pools import GpuPool, default_pools

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger
    from airflow_gpupool.testing.server import KubernetesEmulatorServer

NodeSpec = GpuPool | Mapping[str, Any]


def ledger_connection(ledger_url: str, bindings: Mapping[str, str], poll_interval: float = 0.2) -> str:
    """Return the ``AIRFLOW_CONN_GPUPOOL_DEFAULT`` value of a test ledger.

    :param ledger_url: the ledger's SQLAlchemy URL
    :param bindings: binding per node pool
    :param poll_interval: how often a waiting task looks at the queue, seconds
    """
    extra: dict[str, Any] = {"ledger_url": ledger_url, "poll_interval_seconds": poll_interval}
    if bindings:
        extra["node_pool_bindings"] = ",".join(f"{pool}={name}" for pool, name in sorted(bindings.items()))
    return json.dumps({"conn_type": "gpupool", "extra": extra})


def kubernetes_connection(kubeconfig_path: str) -> str:
    """Return the ``AIRFLOW_CONN_KUBERNETES_DEFAULT`` value for the emulator.

    :param kubeconfig_path: the emulator's kubeconfig
    """
    extra = {"kube_config_path": kubeconfig_path, "in_cluster": False}
    return json.dumps({"conn_type": "kubernetes", "extra": extra})


def flatten(specs: Iterable[NodeSpec]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Return the Node objects of some pools and nodes, and the binding of each pool.

    :param specs: pools and Node objects, in order
    :raises ValueError: two nodes with one name
    """
    nodes: list[dict[str, Any]] = []
    bindings: dict[str, str] = {}
    for spec in specs:
        if isinstance(spec, GpuPool):
            nodes.extend(dict(n) for n in spec.nodes)
            bindings[spec.name] = spec.binding
        else:
            nodes.append(dict(spec))
    names = [n["metadata"]["name"] for n in nodes]
    if len(set(names)) != len(names):
        raise ValueError(f"node names must be unique, got {sorted(names)}")
    return nodes, bindings


class GpuCluster:
    """An emulated GPU cluster with its ledger, set up for ``dag.test()``.

    :param k8s: a running emulator (its nodes are replaced)
    :param ledger: the ledger (its inventory is synced from the emulator)
    :param env: where to set the connections (``os.environ``, or pytest's ``monkeypatch``)
    """

    def __init__(self, k8s: KubernetesEmulatorServer, ledger: Ledger, env: MutableMapping[str, str]) -> None:
        self.k8s = k8s
        self.ledger = ledger
        self._env = env
        self.bindings: dict[str, str] = {}

    def configure(self, nodes: Iterable[NodeSpec] | None = None, *, poll_interval: float = 0.2) -> GpuCluster:
        """Replace the cluster's nodes, sync the ledger's inventory, and set the connections.

        :param nodes: pools (:func:`~airflow_gpupool.testing.whole_gpu_pool`...) and Node objects;
            :func:`~airflow_gpupool.testing.cluster.pools.default_pools` when ``None``
        :param poll_interval: how often a waiting task looks at the queue, seconds
        """
        from airflow_gpupool.inventory.sync import core_v1_api, sync_inventory

        node_objects, self.bindings = flatten(default_pools() if nodes is None else nodes)
        self.k8s.reset(nodes=node_objects)
        synced = sync_inventory(self.ledger, core_v1_api(self.k8s.kubeconfig_path))
        if synced.errors:
            raise ValueError(f"the ledger could not take these nodes: {synced.errors}")
        self._env["AIRFLOW_CONN_GPUPOOL_DEFAULT"] = ledger_connection(
            self.ledger.url, self.bindings, poll_interval
        )
        self._env["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = kubernetes_connection(self.k8s.kubeconfig_path)
        self._env["KUBECONFIG"] = self.k8s.kubeconfig_path
        return self

    @property
    def kubeconfig_path(self) -> str:
        """The emulator's kubeconfig."""
        return self.k8s.kubeconfig_path

    def run_dag(self, dag_id: str, **test_args: Any) -> Any:
        """Run a DAG of the DAGs folder with ``dag.test()`` against this cluster and return its DagRun.

        ``dag.test()`` only runs DAGs it can find in the DAGs folder (``AIRFLOW__CORE__DAGS_FOLDER``),
        so the DAG is read from there; import errors fail the run with the file's own message.
        The DagRun is Airflow's, as ``dag.test()`` returns it: ``state`` is ``"success"`` or
        ``"failed"`` (a failed task does not raise), with ``run_id``, ``conf`` and
        ``get_task_instances()`` (each task's ``task_id``, ``state``, ``try_number``); the kit's
        guide, ``airflow_gpupool/testkit/README.md``, shows it in a test.

        :param dag_id: the DAG
        :param test_args: passed to ``dag.test()`` (``logical_date``, ``run_conf``...)
        :raises LookupError: no such DAG in the folder, or the folder has import errors
        """
        from airflow_gpupool.testing.dagbag import dag_bag_class

        DagBag = dag_bag_class()

        bag = DagBag()
        if bag.import_errors:
            raise LookupError(f"the DAGs folder has import errors: {bag.import_errors}")
        dag = bag.get_dag(dag_id)
        if dag is None:
            raise LookupError(
                f"no DAG {dag_id!r} in the DAGs folder {bag.dag_folder}; it has {sorted(bag.dag_ids)}"
            )
        return dag.test(**test_args)

    def created_pods(self) -> list[dict[str, Any]]:
        """Return the pod specs clients sent to the cluster, oldest first."""
        return self.k8s.created_pods()
