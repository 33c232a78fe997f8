"""The statements on the ledger's hot path, built once with bind parameters.

Building a SQLAlchemy Core statement costs more than running it on a local database, so
the statements every reserve and release runs are constructed here, once per process.
"""

from __future__ import annotations

from sqlalchemy import and_, bindparam, func, or_, select, update

from airflow_gpupool.ledger.db import schema

_n = schema.nodes.c
_g = schema.gpus.c
_m = schema.mig_slices.c
_r = schema.reservations.c

#: The ``gpupool_meta`` key of the spent requests' version (:mod:`~airflow_gpupool.ledger.queue.queue_copy`);
#: absent until the first write that changes them stamps it.
SPENT_VERSION_KEY = "spent_queue_version"
READ_META = select(schema.ledger_meta.c.key, schema.ledger_meta.c.value)
BUMP_META = (
    update(schema.ledger_meta)
    .where(schema.ledger_meta.c.key == bindparam("meta_key"))
    .values(value=bindparam("meta_value"))
)
ROW_BY_ID = select(schema.reservations).where(_r.id == bindparam("id"))
DUE = select(schema.reservations).where(
    or_(
        and_(_r.state == "granted", _r.expires_at < bindparam("now")),
        and_(_r.state == "waiting", _r.deadline < bindparam("now")),
        and_(_r.state == "waiting", _r.not_before <= bindparam("now")),
    )
)
# Whether anything is due at all: what a waiting process reads before it takes the write lock.
ANY_DUE = (
    select(_r.id)
    .where(
        or_(
            and_(_r.state == "granted", _r.expires_at < bindparam("now")),
            and_(_r.state == "waiting", _r.deadline < bindparam("now")),
            and_(_r.state == "waiting", _r.not_before <= bindparam("now")),
        )
    )
    .limit(1)
)
# A request queued ahead whose not_before has come waits as any other from then on.
CLEAR_NOT_BEFORE = update(schema.reservations).where(_r.id == bindparam("rid")).values(not_before=None)
WAITING = (
    select(_r.id, _r.request, _r.priority, _r.seq, _r.overtakes, _r.not_before, _r.run_key, _r.run_peak_milli)
    .where(_r.state == "waiting")
    .order_by(_r.priority.desc(), _r.seq, _r.id)
)
# The queue as an incremental pass reads it (:meth:`~airflow_gpupool.ledger.queue.cycle.WriteCycle.serve`):
# the requests whose overtake budget is not spent, the shapes of the spent ones, the spent
# ones of given shapes, and the first spent one of the shapes that fit nowhere.
WAITING_UNSPENT = WAITING.where(_r.overtakes < bindparam("spent"))
# The spent requests are most of a long queue: read in service order along the queue's index
# (``+ 0`` keeps SQLite off the index of the unspent ones, which would sort them all first).
_SPENT = (_r.overtakes + 0) >= bindparam("spent")
SPENT_SHAPES = select(_r.request).where(_r.state == "waiting", _SPENT).distinct()
WAITING_SPENT_OF = WAITING.where(_SPENT, _r.request.in_(bindparam("shapes", expanding=True)))
WAITING_SPENT = WAITING.where(_SPENT)
FIRST_SPENT_OF = WAITING_SPENT_OF.limit(1)
# The queue serves higher priorities first, then the older request (lower ``seq``), then by id
# (a gang's growth members share its ``seq``).
#: The external holds (pods the ledger did not grant), for why a request waits.
EXTERNAL_HOLDS = select(schema.reservations).where(_r.state == "external")
#: The runs admitted as a whole that hold a grant now (their other entry steps are admitted too).
RUNS_HOLDING = select(_r.run_key).where(
    _r.state.in_(("granted", "orphaned")), _r.run_key.in_(bindparam("keys", expanding=True))
)
WAITING_AHEAD = select(func.count()).where(
    _r.state == "waiting",
    or_(
        _r.priority > bindparam("priority"),
        and_(_r.priority == bindparam("priority"), _r.seq < bindparam("seq")),
        and_(_r.priority == bindparam("priority"), _r.seq == bindparam("seq"), _r.id < bindparam("rid")),
    ),
)
SET_OVERTAKES = (
    update(schema.reservations).where(_r.id == bindparam("rid")).values(overtakes=bindparam("overtake_count"))
)

TAKE_NODE = (
    update(schema.nodes)
    .where(
        _n.name == bindparam("at_node"), _n.cpu_free >= bindparam("cpu"), _n.memory_free >= bindparam("mem")
    )
    .values(
        cpu_free=_n.cpu_free - bindparam("cpu"),
        memory_free=_n.memory_free - bindparam("mem"),
        n_training=_n.n_training + bindparam("training"),
        n_inference=_n.n_inference + bindparam("inference"),
        version=bindparam("new_version"),
    )
)
RETURN_NODE = (
    update(schema.nodes)
    .where(_n.name == bindparam("at_node"))
    .values(
        cpu_free=_n.cpu_free + bindparam("cpu"),
        memory_free=_n.memory_free + bindparam("mem"),
        n_training=_n.n_training - bindparam("training"),
        n_inference=_n.n_inference - bindparam("inference"),
        version=bindparam("new_version"),
    )
    .returning(_n.n_training, _n.n_inference, _n.health, _n.remove_when_drained)
)
TAKE_GPUS = (
    update(schema.gpus)
    .where(
        _g.node == bindparam("at_node"),
        _g.idx.in_(bindparam("indices", expanding=True)),
        _g.free_milli >= bindparam("milli"),
        _g.free_memory_mib >= bindparam("gmem"),
        _g.partitioned.is_(False),
    )
    .values(
        free_milli=_g.free_milli - bindparam("milli"), free_memory_mib=_g.free_memory_mib - bindparam("gmem")
    )
)
RETURN_GPUS = (
    update(schema.gpus)
    .where(_g.node == bindparam("at_node"), _g.idx.in_(bindparam("indices", expanding=True)))
    .values(
        free_milli=_g.free_milli + bindparam("milli"), free_memory_mib=_g.free_memory_mib + bindparam("gmem")
    )
)
TAKE_MIG = (
    update(schema.mig_slices)
    .where(_m.node == bindparam("at_node"), _m.slice_id == bindparam("at_slice"), _m.holder.is_(None))
    .values(holder=bindparam("rid"))
)
RETURN_MIG = (
    update(schema.mig_slices)
    .where(_m.node == bindparam("at_node"), _m.slice_id == bindparam("at_slice"))
    .values(holder=None)
)
GRANT_ROW = (
    update(schema.reservations)
    .where(_r.id == bindparam("rid"), _r.state == "waiting")
    .values(
        state="granted",
        granted_at=bindparam("now"),
        node=bindparam("granted_node"),
        gpu_indices=bindparam("indices_json"),
        milli_per_gpu=bindparam("milli"),
        gpu_memory_mib=bindparam("gmem"),
        mig_slice=bindparam("granted_slice"),
        message=None,
        expires_at=bindparam("now") + _r.ttl,
    )
)
ORPHAN_ROW = (
    update(schema.reservations)
    .where(_r.id == bindparam("rid"), _r.state == "granted")
    .values(state="orphaned", orphaned_at=bindparam("now"), message=bindparam("orphan_message"))
)
BIND_ROW = (
    update(schema.reservations)
    .where(_r.id == bindparam("rid"))
    .values(
        pod_namespace=bindparam("namespace"),
        pod_name=bindparam("name"),
        pod_uid=bindparam("uid"),
        bound_at=bindparam("now"),
    )
)
END_ROW = (
    update(schema.reservations)
    .where(_r.id == bindparam("rid"))
    .values(state=bindparam("new_state"), ended_at=bindparam("now"), message=bindparam("end_message"))
)
