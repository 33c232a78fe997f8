"""The controller side: keep the ledger's grants true to the pods that run under them.

:mod:`airflow_gpupool.controller.run` is the loop of ``gpupool controller run`` (sync, reconcile,
reap on intervals); :mod:`airflow_gpupool.controller.leader` elects one replica through a Lease.

:mod:`airflow_gpupool.controller.reconcile` judges grants by their pods. Its names are not
re-exported here: a function ``reconcile`` in this namespace would shadow the module of that name
(``import airflow_gpupool.controller.reconcile as m`` and ``mock.patch`` paths would get the function).
"""

from __future__ import annotations
