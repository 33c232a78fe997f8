"""Quota admission, headroom and fair order in the ledger's queue service (only where quotas exist).

With no quota stored, nothing here runs and nothing is read: the ledger's meta row
``quota_version`` (part of the stamp every transaction reads anyway) is absent or 0, and the
queue is served as before quotas. With quotas, each pass over the queue builds one
:class:`Governance`: the quota rows (cached per process by ``quota_version``) and the live
grants' usage (read once per pass), on which

- a request is placed only on nodes whose flavors (``pool:NAME``, ``model:NAME``) admit it for
  its team (:meth:`~airflow_gpupool.governance.admission.QuotaState.admit`; a gang counts its
  members' total, and is checked again per flavor once placed);
- a request its team's quota refuses on every node waits *outside* the pass: it neither holds
  a node nor counts overtakes (capacity is not what it waits for), and it is tried again at
  every pass, so it is granted once its team's usage drops or its cohort lends;
- a request that is not urgent (:meth:`Governance.urgent`) is placed in a node pool only while
  the pool keeps its headroom free (:func:`~airflow_gpupool.governance.capacity.fits_headroom`
  on what the pool's live grants hold), whatever its team's quota: only urgent work holds the
  headroom outright (:mod:`~airflow_gpupool.governance.capacity` says why). A preemptible one
  may take headroom the quota file lends, and its grant is marked ``headroom_loan``
  (:func:`mark_headroom_loan`) so urgent work may preempt it; refused by every pool, a request
  waits outside the pass as above;
- within one priority, the team furthest below its fair share goes first
  (:meth:`~airflow_gpupool.governance.fairness.FairShare.order`), then FIFO; the queue's
  no-starvation rule then applies to that order unchanged.

A node with GPUs of several models is admitted only if every one of its models admits the
request (the placement may choose any of them). Within a pass usage only grows, so a
request refused at the start of a pass stays refused in it.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import Connection, select, update

from airflow_gpupool.governance.queue_pass import Governance
from airflow_gpupool.governance.quotas import QuotaPlan
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.records import HOLDING, assignment_of
from airflow_gpupool.ledger.store.transactions import LedgerStore
from airflow_gpupool.placement.snapshot import NodeState

__all__ = ["Governance", "mark_headroom_loan", "read_governance"]


def read_governance(
    conn: Connection, store: LedgerStore, plan: QuotaPlan, nodes: Mapping[str, NodeState]
) -> Governance:
    """Count what the live grants hold (orphans included), as :meth:`LedgerQuotas.usage` does."""
    r = schema.reservations.c
    rows = conn.execute(select(schema.reservations).where(r.state.in_(HOLDING))).all()
    return Governance.of_grants(plan, ((store.request_of(row), assignment_of(row)) for row in rows), nodes)


def mark_headroom_loan(conn: Connection, reservation_id: str) -> None:
    """Record that a grant was admitted on the headroom lent to preemptible work."""
    r = schema.reservations.c
    conn.execute(update(schema.reservations).where(r.id == reservation_id).values(headroom_loan=True))
