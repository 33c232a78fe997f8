"""The page's links: a task try to its task instance in the Airflow UI and to its DAG run's GPU steps, a reservation and a team to their pages."""

from __future__ import annotations

from html import escape
from urllib.parse import quote, urlencode

from airflow_gpupool.task_try import TaskTry


def task_instance_url(task: TaskTry, ui_base: str = "") -> str:
    """Return the Airflow 3 UI path of the task instance (its mapped instance when mapped).

    :param task: the try, as :meth:`TaskTry.from_holder` reads it from a holder string
    :param ui_base: the Airflow UI's path prefix (empty when served at the root)
    """
    path = (
        f"{ui_base.rstrip('/')}/dags/{quote(task.dag_id, safe='')}/runs/{quote(task.run_id, safe='')}"
        f"/tasks/{quote(task.task_id, safe='')}"
    )
    return f"{path}/mapped/{task.map_index}" if task.map_index >= 0 else path


def short_id(rid: str) -> str:
    """Return a reservation id shortened for a table: a gang member keeps its ``.N`` suffix.

    :param rid: the id (a gang member's is ``<leader>.<index>``)
    """
    head, dot, index = rid.rpartition(".")
    if dot and index.isdigit() and len(rid) > 12:
        return f"{head[:12]}.{index}"
    return rid[:12]


def rid_link(rid: str, link_base: str = "reservations/") -> str:
    """Return a reservation id as a link to its page, shortened, the whole id in its title.

    :param rid: the reservation id
    :param link_base: the path before the id that opens its page
    """
    return (
        f'<a class="rid" href="{escape(link_base)}{escape(rid)}" title="{escape(rid)}">'
        f"<code>{escape(short_id(rid))}</code></a>"
    )


def team_link(team: str, link_base: str = "teams/") -> str:
    """Return a team's name as a link to its console page.

    :param team: the team
    :param link_base: the path before the team's name that opens its page
    """
    return f'<a class="team-link" href="{escape(link_base)}{escape(quote(team, safe=""))}">{escape(team)}</a>'


def run_query(dag_id: str, run_id: str) -> str:
    """Return the query string that names a DAG run (``?dag_id=..&run_id=..``)."""
    return "?" + urlencode({"dag_id": dag_id, "run_id": run_id})


def run_link(holder: str, base: str = "run") -> str:
    """Return a link to the run chain of the run a holder's try belongs to (empty: no task try).

    :param holder: a reservation's holder string
    :param base: the path of the run page, relative to where the link is shown
    """
    ref = TaskTry.from_holder(holder)
    if ref is None:
        return ""
    href = escape(base + run_query(ref.dag_id, ref.run_id))
    return (
        f' <a class="run-link" href="{href}" title="the GPU steps of run {escape(ref.run_id)}">run chain</a>'
    )
