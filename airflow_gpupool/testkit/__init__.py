"""The testing kit for DAG authors: an emulated GPU cluster, its ledger, and pytest fixtures.

``pip install airflow-gpupool[testing]`` registers the fixtures ``gpu_cluster`` and
``gpupool_ledger`` (a ``pytest11`` entry point, :mod:`airflow_gpupool.testkit.fixtures`)::

    def test_train(gpu_cluster):
        cluster = gpu_cluster(nodes=[hami_pool("t4-shared", gpus=2)])
        ...  # dag.test(): GpuPodOperator finds the ledger and the emulator through the connections

The pools (:func:`~airflow_gpupool.testing.whole_gpu_pool`, ``mig_pool``, ``hami_pool``,
``kai_pool``) live in :mod:`airflow_gpupool.testing`; this package sits above the ledger and the
inventory sync, which it uses, so it is a layer of its own. Nothing is imported here: pytest
loads the plugin in every run of an environment that has the package, so it must cost nothing
until a test asks for a fixture (and must not fail where the ``testing`` extra is missing).
"""
