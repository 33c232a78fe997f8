"""The ledger's tables (SQLAlchemy Core); the same schema on SQLite and PostgreSQL.

``reservations`` is the source of truth for who holds what. The free-capacity columns of
``nodes``, ``gpus`` and ``mig_slices`` are kept in step with it in the same transaction,
so placement reads capacity without summing grants; :meth:`Ledger.check_invariants`
recomputes them from the reservations to prove they agree.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

schema_version = Table(
    "gpupool_schema_version",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("description", String(200), nullable=False),
    Column("applied_at", Float, nullable=False),
)

# Counters bumped by every write transaction: ``version`` (any change; rows carry the
# version that last touched them) and ``inventory_generation`` (nodes added or removed).
ledger_meta = Table(
    "gpupool_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", BigInteger, nullable=False),
)
#: The meta key stamped with the write version that stored the quotas (0 or absent: none stored).
QUOTA_VERSION_KEY = "quota_version"

nodes = Table(
    "gpupool_nodes",
    metadata,
    Column("name", String(253), primary_key=True),
    Column("cpu_milli", BigInteger, nullable=False),
    Column("memory_mib", BigInteger, nullable=False),
    Column("cpu_free", BigInteger, nullable=False),
    Column("memory_free", BigInteger, nullable=False),
    Column("labels", Text, nullable=False, default="{}"),
    Column("node_pool", String(253), nullable=False, default="default"),
    Column("health", String(32), nullable=False, default="healthy"),
    Column("remove_when_drained", Boolean, nullable=False, default=False),
    Column("n_training", Integer, nullable=False, default=0),
    Column("n_inference", Integer, nullable=False, default=0),
    Column("heartbeat_at", Float, nullable=True),
    Column("updated_at", Float, nullable=False),
    Column("version", BigInteger, nullable=False),
    # Schema v7 (the node agent): who set the health and why; the agent's interval, since when
    # its heartbeats have come without a gap, and its last report with the ledger's judgement.
    Column("health_source", String(16), nullable=False, default="inventory"),
    Column("health_reason", Text, nullable=True),
    Column("heartbeat_interval", Float, nullable=True),
    Column("heartbeat_streak_since", Float, nullable=True),
    Column("agent_state", Text, nullable=True),
    # Schema v13 (the queue gate): the waiting request the queue holds this node for, if any;
    # grants on it and releases from it go through the queue (see ledger.gate).
    Column("held_for", String(64), nullable=True),
    # Schema v15 (PostgreSQL): whether the queue's first request, as the last pass saw it, fits
    # this node empty: a release that empties it hands it over (see postgres/sql/gpupool_give_back.sql).
    Column("head_fits", Boolean, nullable=False, default=False),
    # Schema v17: since when (ledger clock) and why the node is suspect: a granted pod found the
    # GPUs the ledger called free taken. It takes no grant until an inventory sync that read the
    # node after that time clears it (see ledger/nodes/suspects.py).
    Column("suspect_since", Float, nullable=True),
    Column("suspect_reason", Text, nullable=True),
)
Index("ix_gpupool_nodes_version", nodes.c.version)
Index("ix_gpupool_nodes_held_for", nodes.c.held_for)

gpus = Table(
    "gpupool_gpus",
    metadata,
    Column("node", String(253), primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("uuid", String(253), nullable=False),
    Column("model", String(253), nullable=False),
    Column("memory_mib", BigInteger, nullable=False),
    Column("free_milli", Integer, nullable=False),
    Column("free_memory_mib", BigInteger, nullable=False),
    Column("partitioned", Boolean, nullable=False, default=False),
    # Schema v7: the UUID is verified once the node agent reported it (matched by index and PCI
    # bus id); a GPU's own health (an XID, lost, ECC) beside its node's.
    Column("uuid_verified", Boolean, nullable=False, default=False),
    Column("bus_id", String(32), nullable=True),
    Column("health", String(32), nullable=False, default="healthy"),
    Column("health_source", String(16), nullable=False, default="inventory"),
    Column("health_reason", Text, nullable=True),
    ForeignKeyConstraint(["node"], ["gpupool_nodes.name"], ondelete="CASCADE"),
)

mig_slices = Table(
    "gpupool_mig_slices",
    metadata,
    Column("node", String(253), primary_key=True),
    Column("slice_id", String(253), primary_key=True),
    Column("gpu_idx", Integer, nullable=False),
    Column("profile", String(32), nullable=False),
    Column("holder", String(64), nullable=True),
    ForeignKeyConstraint(["node"], ["gpupool_nodes.name"], ondelete="CASCADE"),
)

reservations = Table(
    "gpupool_reservations",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("holder", String(512), nullable=False),
    Column("request", Text, nullable=False),
    Column("priority", Integer, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("state", String(16), nullable=False),
    Column("team", String(253), nullable=False),
    Column("workload_class", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("deadline", Float, nullable=False),
    Column("ttl", Float, nullable=False),
    Column("overtakes", Integer, nullable=False, default=0),
    Column("granted_at", Float, nullable=True),
    Column("expires_at", Float, nullable=True),
    Column("ended_at", Float, nullable=True),
    Column("node", String(253), nullable=True),
    Column("gpu_indices", String(512), nullable=True),
    Column("milli_per_gpu", Integer, nullable=True),
    Column("gpu_memory_mib", BigInteger, nullable=True),
    Column("mig_slice", String(253), nullable=True),
    Column("message", Text, nullable=True),
    # The pod bound to a grant (schema v4): a bound grant whose lease expires is orphaned,
    # and keeps its slice until reconcile sees the pod finished or gone, or deletes it.
    Column("pod_namespace", String(253), nullable=True),
    Column("pod_name", String(253), nullable=True),
    Column("pod_uid", String(64), nullable=True),
    Column("bound_at", Float, nullable=True),
    Column("orphaned_at", Float, nullable=True),
    # Gangs (schema v8): every member row carries its leader's id (the leader its own) and
    # its index in the gang (the leader 0); None on single reservations.
    Column("gang_id", String(64), nullable=True),
    Column("gang_index", Integer, nullable=True),
    # Preemption (schema v11): a victim keeps its state ``granted`` with a deadline by which its
    # pod must have ended (its lease runs out then too), and the request it yields to. The newest
    # valid checkpoint's time, as its holder reports it, ranks victims by the work they would lose.
    Column("preempt_deadline", Float, nullable=True),
    Column("preempted_by", String(64), nullable=True),
    Column("checkpoint_at", Float, nullable=True),
    # Headroom (schema v12): the grant was admitted on the headroom lent to preemptible work,
    # so urgent work may take it back whatever its team's quota (None: not on loan).
    Column("headroom_loan", Boolean, nullable=True),
    # Queued ahead (schema v22): a request entered before its task runs (the next step of a DAG
    # run, at its upstream's forecast end) keeps its place but is not granted before this time.
    Column("not_before", Float, nullable=True),
    # Run admission (schema v23): the first GPU step of a DAG run admitted as a whole waits until
    # its team's quota (or the pool) serves the run's peak (ledger.teams.run_gate).
    Column("run_key", String(500), nullable=True),
    Column("run_peak_milli", Integer, nullable=True),
    # Queue ahead (schema v24): a request entered for a downstream step names its upstream grant
    # (kept once not_before clears); an upstream with plans ahead is marked, so its end finds them.
    Column("ahead_of", String(64), nullable=True),
    Column("ahead_planned", Boolean, nullable=True),
)
Index("ix_gpupool_reservations_queue", reservations.c.state, reservations.c.priority, reservations.c.seq)
Index("ix_gpupool_reservations_expiry", reservations.c.state, reservations.c.expires_at)
Index("ix_gpupool_reservations_node", reservations.c.node, reservations.c.state)
Index("ix_gpupool_reservations_gang", reservations.c.gang_id)
# Schema v14: every write looks for overdue waits, and every grant past the queue counts the
# overtakes of the unspent requests; without these, both read every waiting row.
Index("ix_gpupool_reservations_deadline", reservations.c.state, reservations.c.deadline)
Index("ix_gpupool_reservations_unspent", reservations.c.state, reservations.c.overtakes)

# One row per failed task try (schema v2): how it failed, what it ran with, what the next try
# must ask for, and whether a person was told. Keyed by the task instance (without the try),
# so a retry on any worker reads what the tries before it learned.
task_attempts = Table(
    "gpupool_task_attempts",
    metadata,
    Column("task_key", String(512), primary_key=True),
    Column("try_number", Integer, primary_key=True),
    Column("reservation_id", String(64), nullable=False),
    Column("failure_class", String(32), nullable=False),
    Column("remedy", String(32), nullable=False),
    Column("exit_code", Integer, nullable=True),
    Column("request", Text, nullable=False),
    Column("next_request", Text, nullable=True),
    Column("gpu_model", String(253), nullable=True),
    Column("checkpoint_step", BigInteger, nullable=True),
    Column("message", Text, nullable=False),
    Column("escalated", Boolean, nullable=False, default=False),
    Column("created_at", Float, nullable=False),
)

# Team quotas per resource flavor (``pool:NAME`` or ``model:NAME``), in milli-GPU; replaced as a
# whole by ``gpupool quota apply`` (see :mod:`airflow_gpupool.governance.quotas`).
quotas = Table(
    "gpupool_quotas",
    metadata,
    Column("team", String(253), primary_key=True),
    Column("flavor", String(512), primary_key=True),
    Column("cohort", String(253), nullable=True),
    Column("nominal_milli", BigInteger, nullable=False),
    Column("borrowing_limit_milli", BigInteger, nullable=True),
    Column("lending_limit_milli", BigInteger, nullable=True),
    Column("updated_at", Float, nullable=False),
)

# The share of each node pool kept for urgent work (schema v12), replaced with the quotas by
# ``gpupool quota apply`` (see :class:`airflow_gpupool.governance.quotas.Headroom`); the pool
# ``*`` is every pool without a row of its own. No row: no headroom.
headroom = Table(
    "gpupool_headroom",
    metadata,
    Column("pool", String(253), primary_key=True),
    Column("share_milli", Integer, nullable=False),
    Column("lend_to_preemptible", Boolean, nullable=False),
    Column("urgent_priority", Integer, nullable=False),
    Column("updated_at", Float, nullable=False),
)

# What the reservations pruned from the history counted per team (schema v12), so per-team
# counters never go down: the grants that ended ``preempted`` and the work they lost, in
# GPU-milliseconds (see :func:`airflow_gpupool.ledger.teams.usage.preemption_losses`).
team_totals = Table(
    "gpupool_team_totals",
    metadata,
    Column("team", String(253), primary_key=True),
    Column("preempted_grants", BigInteger, nullable=False),
    Column("lost_gpu_ms", BigInteger, nullable=False),
)

# Each waiting request's start-time forecast (schema v18), replaced as a whole by the
# controller's forecast step (see :mod:`airflow_gpupool.forecast`); readers only read. Times
# are on the ledger's clock; ``status`` is ``forecast``, ``never`` or ``unknown`` (then the
# quantiles are null and ``reason`` says why).
forecasts = Table(
    "gpupool_forecasts",
    metadata,
    Column("reservation_id", String(64), primary_key=True),
    Column("computed_at", Float, nullable=False),
    Column("status", String(16), nullable=False),
    Column("p10", Float, nullable=True),
    Column("p50", Float, nullable=True),
    Column("p90", Float, nullable=True),
    Column("position", Integer, nullable=True),
    Column("queue_length", Integer, nullable=True),
    Column("reason", String(500), nullable=False),
)

# Console actions (schema v19): who cancelled, released, cordoned or re-prioritized what, and when.
actions = Table(
    "gpupool_actions",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False),
    Column("actor", String(253), nullable=False),
    Column("action", String(32), nullable=False),
    Column("target", String(253), nullable=False),
    Column("team", String(253), nullable=True),
    Column("detail", Text, nullable=False),
)
Index("ix_gpupool_actions_team", actions.c.team, actions.c.at)

# The empty node of each scalable pool (schema v21), replaced as a whole by the controller's
# autoscale step from ``[gpupool] scalable_node_pools`` and what it discovers; the reserve of any
# process reads it, so a request only a new node could take waits instead of being refused.
# ``node`` is the JSON of the placement node (:mod:`airflow_gpupool.ledger.store.scalable`).
scalable_pools = Table(
    "gpupool_scalable_pools",
    metadata,
    Column("name", String(253), primary_key=True),
    Column("source", String(32), nullable=False),
    Column("node", Text, nullable=False),
    Column("updated_at", Float, nullable=False),
)

# Each node's drift as the controller last computed it (schema v21), replaced as a whole each
# pass; in milli-GPU. ``since``: when the node began to drift (null: it agrees); the page reads it.
node_drift = Table(
    "gpupool_node_drift",
    metadata,
    Column("node", String(253), primary_key=True),
    Column("running_milli", BigInteger, nullable=False),
    Column("drift_milli", BigInteger, nullable=False),
    Column("mismatched", Text, nullable=False),
    Column("since", Float, nullable=True),
    Column("computed_at", Float, nullable=False),
)

# Queue-ahead plans (schema v24): a downstream step's request enters the queue at ``enter_at``
# (the write cycle's due processing enters it then, with a fresh seq), not granted before
# ``not_before``; ``state`` is ``planned``, ``entered`` or ``withdrawn``
# (:mod:`~airflow_gpupool.ledger.grants.queue_ahead`).
queue_ahead = Table(
    "gpupool_queue_ahead",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("upstream_id", String(64), nullable=False),
    Column("task_key", String(512), nullable=False),
    Column("request", Text, nullable=False),
    Column("enter_at", Float, nullable=False),
    Column("not_before", Float, nullable=False),
    Column("idle_seconds", Float, nullable=False),
    Column("timeout", Float, nullable=False),
    Column("state", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
)
Index("ix_gpupool_queue_ahead_due", queue_ahead.c.state, queue_ahead.c.enter_at)
Index("ix_gpupool_queue_ahead_upstream", queue_ahead.c.upstream_id)
Index("ix_gpupool_queue_ahead_step", queue_ahead.c.task_key)
