"""The "GPU reservation" extra link of ``GpuPodOperator`` task instances.

A try's reservation id is derived from the try itself (:attr:`TaskTry.reservation_id`), so the
link needs no XCom and works for a try still waiting in the queue: it opens the GPU pool page of
that reservation (where it ran, how long it waited and held its slice, why it ended). The link
also names the try (``?try=dag/task/run/map-N/try-T``): a retry that re-attached to an earlier
try's pod adopted that try's grant and has no reservation of its own id, and the page then
shows the one it adopted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from airflow.sdk import BaseOperatorLink

from airflow_gpupool.task_try import TaskTry

if TYPE_CHECKING:
    from airflow.sdk.types import TaskInstanceKey

#: Where the plugin serves a reservation's page (the plugin's ``URL_PREFIX`` + ``/reservations/``).
RESERVATION_PAGE = "/gpupool/reservations/"


class GpuReservationLink(BaseOperatorLink):
    """Open the GPU pool page of the task try's reservation."""

    name = "GPU reservation"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        """Return the reservation page of the try ``ti_key`` names.

        :param operator: the task (unused: the try alone names its reservation)
        :param ti_key: the task instance and try
        """
        try_ = TaskTry(
            ti_key.dag_id, ti_key.task_id, ti_key.run_id, ti_key.map_index, max(1, ti_key.try_number)
        )
        return f"{RESERVATION_PAGE}{try_.reservation_id}?{urlencode({'try': try_.holder.rstrip('@')})}"
