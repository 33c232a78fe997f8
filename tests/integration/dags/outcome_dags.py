"""DAGs whose pod ends while reconcile runs every second: reconcile releases the grant before the task.

The sync tasks' completion callback stands for work done after the pod ended (an upload, a
report): time in which the controller sees the pod ended and releases its grant. The deferrable
tasks' pod trigger sees the pod running, then looks again only 10 s later: reconcile sees the
end first. Either way the try must be what
the pod did (``Succeeded``, or a crash: ``application_error``), never a lost lease.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.cncf.kubernetes.callbacks import KubernetesPodOperatorCallback
from airflow.sdk import DAG

from airflow_gpupool.operators import GpuPodOperator

KUBECONFIG = os.environ.get("GPUPOOL_TEST_KUBECONFIG", "/nonexistent/kubeconfig")
#: Seconds the sync tasks spend after their pod ended (three reconcile passes, three renewals).
AFTER_THE_POD_S = 3.0


class ReportAfterThePod(KubernetesPodOperatorCallback):
    """Work after the pod ended, before the task releases its grant (an upload, say)."""

    @staticmethod
    def on_pod_completion(**kwargs: Any) -> None:
        """Take :data:`AFTER_THE_POD_S`."""
        time.sleep(AFTER_THE_POD_S)


def outcome_dag(dag_id: str, *, deferrable: bool, exit_code: int) -> DAG:
    """A pod of 4 s that exits with ``exit_code``, on a 3 s lease (renewed every second).

    A crash fails the task at once (``application_error`` → ``fail``, though a retry is left): the
    ladder decides from the pod's class. A lost lease would be retried.
    """
    with DAG(
        dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["gpupool-test"]
    ) as dag:
        GpuPodOperator(
            task_id="train",
            name=dag_id.replace("_", "-"),
            random_name_suffix=False,
            namespace="default",
            image="registry.example/train:1",
            cmds=["python", "train.py"],
            config_file=KUBECONFIG,
            in_cluster=False,
            get_logs=False,
            startup_check_interval_seconds=1,
            poll_interval=10,
            gpus=1,
            lease_ttl=3,
            deferrable=deferrable,
            callbacks=None if deferrable else ReportAfterThePod,
            retries=1,
            retry_delay=timedelta(0),
            escalation={"application_error": "fail"},
            annotations={
                "gpupool.emulator/duration-seconds": "4",
                "gpupool.emulator/exit-code": str(exit_code),
            },
        )
    return dag


succeeds_sync = outcome_dag("gpu_outcome_succeeds", deferrable=False, exit_code=0)
crashes_sync = outcome_dag("gpu_outcome_crashes", deferrable=False, exit_code=1)
succeeds_deferrable = outcome_dag("gpu_outcome_succeeds_deferrable", deferrable=True, exit_code=0)
crashes_deferrable = outcome_dag("gpu_outcome_crashes_deferrable", deferrable=True, exit_code=1)
