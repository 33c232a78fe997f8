"""PostgreSQL functions of the ledger's concurrent path (schema v3; v5 measures on the database's clock;
v7 skips quarantined GPUs; v13 passes waiting requests as the queue gate allows, :mod:`.gate`;
v14 queues a request that fits no node and leaves the gate as it is; v15 hands an emptied node to
the queue's first request; v16 lowers the gate's unspent priority when a grant spends the last
unspent budget).

A grant or release that needs no queue decision does not have to wait for every other
writer: it takes the ledger lock in *shared* mode, locks only its node's row, and commits
on its own, so PostgreSQL commits many of them together. Each function is one round trip
and one transaction. When the queue must decide (requests wait and the gate the last pass left
does not let this grant or release pass them), a lease is overdue, the inventory
changed, or anything else needs the serialized path, a function changes nothing and
answers ``serialize``: the caller then takes the exclusive lock (see
:mod:`airflow_gpupool.ledger.grants.serialized`).

Why this is safe:

* Queue decisions, expiry and inventory changes hold the lock exclusively, so while one
  runs no function does, and a function sees everything they committed (it takes the
  shared lock before it reads anything).
* Every writer locks a node's row before it touches the node's GPUs or MIG slices, so
  the capacity a function checks cannot change before it commits. A grant whose chosen
  GPU or MIG slice was taken meanwhile takes an equivalent one on the same node; if the
  node no longer fits at all it answers ``stale`` and the caller places again.
* A request queued here (``gpupool_wait``) asks for no fewer whole GPUs, and no smaller a
  fraction, than a request already waiting: a release that could make it fit could make that
  one fit too, so the release's gate test sends it to the serialized path, whose pass sees the
  new request. The function checks that no node has what it asks for, on the committed rows
  under the shared lock: a release running meanwhile either passes the gate (its node then
  fits no waiting request of that size) or waits for the exclusive lock, behind this commit.
* A release that empties a node the queue's first request fits (the last pass marked the nodes
  it fits empty, ``head_fits``, for that request's shape, ``queue_head_shape``) grants it there
  (``gpupool_give_back``), as a pass would: no other node fits a waiting request (the gate), what
  it leaves of the node fits none either, and it overtakes nobody. If the pass held a node for
  it, the hold passes to the next request when a pass would hold that node for it too (spent, of
  the same shape). The first two requests are locked before the hold's meta row, and a grant
  that spends a budget reads the hold ``FOR SHARE`` once its counted rows are locked, so the two
  commit one after the other, never across.
* Rows are stamped with the writer's transaction id (``version``), so a reader finds what
  changed since its last look from the oldest transaction running then
  (:class:`airflow_gpupool.ledger.store.cache.CapacityCache`).
"""

from __future__ import annotations

from sqlalchemy import Connection

from airflow_gpupool.ledger.db.engine import ADVISORY_LOCK_KEY

_TAKE = """
CREATE OR REPLACE FUNCTION gpupool_take(
    p_id text, p_holder text, p_request text, p_priority integer, p_team text, p_class text,
    p_now double precision, p_timeout double precision, p_ttl double precision, p_generation bigint,
    p_node text, p_cpu bigint, p_mem bigint, p_indices integer[], p_model text,
    p_milli integer, p_gmem bigint, p_slice text, p_profile text,
    OUT outcome text, OUT taken_indices integer[], OUT taken_slice text, OUT taken_at double precision
) LANGUAGE plpgsql AS $$
DECLARE
    v_node record;
    v_gpu integer;
    v_xid bigint;
    v_waiting boolean;
    v_bound bigint;
    v_spent bigint;
    v_first_priority bigint;
    v_first_seq bigint;
    v_hold_priority bigint;
    v_hold_seq bigint;
    p_deadline double precision;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(__LOCK_KEY__, hashtext(current_schema()));
    -- The database's clock once the lock is held, unless the caller's clock was injected (tests).
    p_now := coalesce(p_now, extract(epoch FROM clock_timestamp())::float8);
    p_deadline := p_now + p_timeout;
    taken_at := p_now;
    -- Queue order, expiry and new inventory are decided with the lock held exclusively; a grant
    -- may pass waiting requests only as the last pass's gate allows (ledger.gate).
    v_waiting := EXISTS (SELECT 1 FROM gpupool_reservations WHERE state = 'waiting');
    -- A preemptible grant while requests wait goes through a pass, which offers it as a victim.
    IF (v_waiting AND (coalesce((SELECT value FROM gpupool_meta WHERE key = 'queue_gate_open'), 0) <> 1
                       OR strpos(p_request, '"preemptible": true') > 0))
       OR EXISTS (SELECT 1 FROM gpupool_reservations WHERE state = 'granted' AND expires_at < p_now)
       OR (SELECT value FROM gpupool_meta WHERE key = 'inventory_generation') IS DISTINCT FROM p_generation
       OR EXISTS (SELECT 1 FROM gpupool_reservations WHERE id = p_id) THEN
        outcome := 'serialize';
        RETURN;
    END IF;
    -- Wait for a writer that holds the node: its commit is a few milliseconds away.
    SELECT * INTO v_node FROM gpupool_nodes WHERE name = p_node FOR UPDATE;
    -- A node the queue holds for a waiting request drains for it: grants there go through the queue.
    IF FOUND AND v_node.held_for IS NOT NULL THEN
        outcome := 'serialize';
        RETURN;
    END IF;
    -- The caller placed on its copy of the capacity: check it against the row it now holds.
    IF NOT FOUND OR v_node.health <> 'healthy' OR v_node.cpu_free < p_cpu OR v_node.memory_free < p_mem
       OR (p_class = 'training' AND v_node.n_inference > 0)
       OR (p_class = 'inference' AND v_node.n_training > 0) THEN
        outcome := 'stale';
        RETURN;
    END IF;
    -- The slice chosen, or, if a concurrent grant took it, an equivalent one on this node:
    -- another free MIG slice of the profile, or GPUs of the same model (fullest first).
    IF p_slice IS NOT NULL THEN
        SELECT slice_id, gpu_idx INTO taken_slice, v_gpu FROM gpupool_mig_slices
        WHERE node = p_node AND holder IS NULL AND profile = p_profile
          AND gpu_idx IN (SELECT idx FROM gpupool_gpus WHERE node = p_node AND model = p_model
                          AND health = 'healthy')
        ORDER BY slice_id = p_slice DESC, gpu_idx, slice_id
        LIMIT 1;
        IF NOT FOUND THEN
            outcome := 'stale';
            RETURN;
        END IF;
        taken_indices := ARRAY[v_gpu];
    ELSIF cardinality(p_indices) > 0 THEN
        SELECT array_agg(idx ORDER BY idx) INTO taken_indices FROM (
            SELECT idx FROM gpupool_gpus
            WHERE node = p_node AND NOT partitioned AND model = p_model AND health = 'healthy'
              AND free_milli >= p_milli AND free_memory_mib >= p_gmem
            ORDER BY idx = ANY (p_indices) DESC, free_milli, idx
            LIMIT cardinality(p_indices)
        ) AS fitting;
        IF coalesce(cardinality(taken_indices), 0) < cardinality(p_indices) THEN
            outcome := 'stale';
            taken_indices := NULL;
            RETURN;
        END IF;
    ELSE
        taken_indices := '{}';
    END IF;
    v_xid := pg_current_xact_id()::text::bigint;
    -- The grant's row first: the same id reserved at the same moment elsewhere (a task run
    -- twice) waits here for that commit, then finds the row and leaves it to the serialized path.
    INSERT INTO gpupool_reservations (
        id, holder, request, priority, seq, state, team, workload_class, created_at, deadline, ttl,
        overtakes, granted_at, expires_at, node, gpu_indices, milli_per_gpu, gpu_memory_mib, mig_slice
    ) VALUES (
        p_id, p_holder, p_request, p_priority, v_xid, 'granted', p_team, p_class, p_now, p_deadline, p_ttl,
        0, p_now, p_now + p_ttl, p_node, array_to_json(taken_indices)::text, p_milli, p_gmem, taken_slice
    ) ON CONFLICT (id) DO NOTHING;
    IF NOT FOUND THEN
        outcome := 'serialize';
        taken_indices := NULL;
        taken_slice := NULL;
        RETURN;
    END IF;
    UPDATE gpupool_nodes SET
        cpu_free = cpu_free - p_cpu,
        memory_free = memory_free - p_mem,
        n_training = n_training + (p_class = 'training')::integer,
        n_inference = n_inference + (p_class = 'inference')::integer,
        version = v_xid
    WHERE name = p_node;
    IF taken_slice IS NOT NULL THEN
        UPDATE gpupool_mig_slices SET holder = p_id WHERE node = p_node AND slice_id = taken_slice;
    ELSE
        UPDATE gpupool_gpus SET free_milli = free_milli - p_milli, free_memory_mib = free_memory_mib - p_gmem
        WHERE node = p_node AND idx = ANY (taken_indices);
    END IF;
    -- Passing waiting requests whose budget is not spent counts one overtake of each, as a pass
    -- would (rows locked in id order: two grants never wait on each other's rows in a cycle).
    -- One that spends its budget here ahead of the held request (or with none held) closes the
    -- gate: the next writer's pass holds a node for it.
    IF v_waiting AND p_priority <= coalesce(
            (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_unspent_priority'), -9223372036854775808) THEN
        v_bound := coalesce((SELECT value FROM gpupool_meta WHERE key = 'queue_gate_bound'), 0);
        WITH counted AS (
            UPDATE gpupool_reservations SET overtakes = overtakes + 1
            -- (priority + 0: along the index of the unspent ones, statistics or not; a long queue of
            -- spent requests is otherwise walked row by row while the table has none.)
            WHERE id IN (SELECT id FROM gpupool_reservations
                         WHERE state = 'waiting' AND overtakes < v_bound AND (priority + 0) >= p_priority
                         ORDER BY id FOR UPDATE)
            RETURNING overtakes, priority, seq
        )
        SELECT count(*), (array_agg(priority ORDER BY priority DESC, seq))[1],
               (array_agg(seq ORDER BY priority DESC, seq))[1]
        INTO v_spent, v_first_priority, v_first_seq FROM counted WHERE overtakes >= v_bound;
        IF v_spent > 0 THEN
            -- The hold is read once the counted rows are locked, and FOR SHARE: a release that hands
            -- the held request a node and moves the hold (gpupool_give_back) commits wholly before
            -- or after this grant.
            SELECT value INTO v_hold_seq FROM gpupool_meta WHERE key = 'queue_gate_hold_seq' FOR SHARE;
            v_hold_priority := coalesce(
                (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_hold_priority'), -4611686018427387904);
            -- Spent behind the request the queue holds a node for, it changes nothing a pass decides.
            IF v_first_priority > v_hold_priority
               OR (v_first_priority = v_hold_priority AND v_first_seq <= coalesce(v_hold_seq, 0)) THEN
                UPDATE gpupool_meta SET value = 0 WHERE key = 'queue_gate_open';
            END IF;
            INSERT INTO gpupool_meta (key, value) VALUES ('spent_queue_version', v_xid)
            ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;
            -- The gate's unspent priority comes down to what is left unspent, so later grants skip
            -- the count while nothing is. Read once its row is locked: a request queued meanwhile
            -- (gpupool_wait raises the key after its row) is then seen, or raises it after this.
            PERFORM 1 FROM gpupool_meta WHERE key = 'queue_gate_unspent_priority' FOR UPDATE;
            UPDATE gpupool_meta SET value = coalesce(
                (SELECT max(priority) FROM gpupool_reservations WHERE state = 'waiting' AND overtakes < v_bound),
                -4611686018427387904)
            WHERE key = 'queue_gate_unspent_priority';
        END IF;
    END IF;
    outcome := 'granted';
END
$$;
"""

_GIVE_BACK = """
CREATE OR REPLACE FUNCTION gpupool_give_back(
    p_id text, p_now double precision, p_message text,
    OUT outcome text, OUT released_request text, OUT released_node text, OUT released_indices text,
    OUT released_milli integer, OUT released_gmem bigint, OUT released_slice text,
    OUT node_training integer, OUT node_inference integer,
    OUT handed_to text, OUT handed_request text, OUT handed_indices text, OUT handed_gmem bigint
) LANGUAGE plpgsql AS $$
DECLARE
    v_res record;
    v_node record;
    v_request json;
    v_xid bigint;
    v_whole bigint;
    v_largest bigint;
    v_head record;
    v_next record;
    v_head_request json;
    v_spent boolean;
    v_held text;
    v_usable integer;
    v_taken integer[];
BEGIN
    PERFORM pg_advisory_xact_lock_shared(__LOCK_KEY__, hashtext(current_schema()));
    p_now := coalesce(p_now, extract(epoch FROM clock_timestamp())::float8);
    -- Overdue leases expire first: serialized.
    IF EXISTS (SELECT 1 FROM gpupool_reservations WHERE state = 'granted' AND expires_at < p_now) THEN
        outcome := 'serialize';
        RETURN;
    END IF;
    SELECT * INTO v_res FROM gpupool_reservations WHERE id = p_id;
    -- Unknown, or already ended: the serialized path says which. A gang's members end together there.
    IF NOT FOUND OR v_res.state <> 'granted' OR v_res.gang_id IS NOT NULL THEN
        outcome := 'serialize';
        RETURN;
    END IF;
    -- Node first, like every writer; then the grant, which a concurrent release may have ended.
    SELECT * INTO v_node FROM gpupool_nodes WHERE name = v_res.node FOR UPDATE;
    IF NOT FOUND OR v_node.remove_when_drained THEN
        outcome := 'serialize';
        RETURN;
    END IF;
    -- Freed capacity goes to the queue first, unless the last pass's gate says it cannot fit any
    -- waiting request: too few GPUs free once given back (ledger.gate). A held node only comes
    -- closer to fitting its request, so it stays the one held.
    IF EXISTS (SELECT 1 FROM gpupool_reservations WHERE state = 'waiting') THEN
        IF coalesce((SELECT value FROM gpupool_meta WHERE key = 'queue_gate_open'), 0) <> 1 THEN
            outcome := 'serialize';
            RETURN;
        END IF;
        SELECT count(*) FILTER (WHERE after >= 1000), coalesce(max(after), 0) INTO v_whole, v_largest
        FROM (
            SELECT free_milli + CASE WHEN v_res.mig_slice IS NULL AND idx IN (
                SELECT value::integer FROM json_array_elements_text(v_res.gpu_indices::json))
                THEN v_res.milli_per_gpu ELSE 0 END AS after
            FROM gpupool_gpus WHERE node = v_res.node AND NOT partitioned
        ) AS freed;
        IF v_whole >= coalesce((SELECT value FROM gpupool_meta WHERE key = 'queue_gate_min_gpus'), 0)
           OR v_largest >= coalesce((SELECT value FROM gpupool_meta WHERE key = 'queue_gate_min_milli'), 0) THEN
            -- A waiting request may fit the node now. If the release empties it and the queue's first
            -- request fits it empty, the release hands it over, as the pass would; else a pass decides.
            v_request := v_res.request::json;
            IF NOT coalesce(v_node.head_fits, false) OR v_node.health <> 'healthy'
               OR (SELECT value FROM gpupool_meta WHERE key = 'queue_head_generation')
                  IS DISTINCT FROM (SELECT value FROM gpupool_meta WHERE key = 'inventory_generation')
               OR v_node.cpu_free + (v_request ->> 'cpu_milli')::bigint <> v_node.cpu_milli
               OR v_node.memory_free + (v_request ->> 'memory_mib')::bigint <> v_node.memory_mib
               OR v_res.mig_slice IS NOT NULL
               OR EXISTS (SELECT 1 FROM gpupool_gpus WHERE node = v_res.node AND (
                      partitioned OR health <> 'healthy'
                      OR free_milli + CASE WHEN idx IN (
                             SELECT value::integer FROM json_array_elements_text(v_res.gpu_indices::json))
                         THEN v_res.milli_per_gpu ELSE 0 END <> 1000
                      OR free_memory_mib + CASE WHEN idx IN (
                             SELECT value::integer FROM json_array_elements_text(v_res.gpu_indices::json))
                         THEN v_res.gpu_memory_mib ELSE 0 END <> memory_mib)) THEN
                outcome := 'serialize';
                RETURN;
            END IF;
            -- The queue's first two requests, locked before the hold (as grants passing the queue
            -- lock what they count before reading the hold): the first is granted, the second may
            -- take over its hold.
            SELECT id, request, priority, seq, overtakes, deadline, ttl, workload_class INTO v_head
            FROM gpupool_reservations WHERE state = 'waiting'
            ORDER BY priority DESC, seq, id LIMIT 1 FOR UPDATE;
            SELECT id, request, priority, seq, overtakes, deadline INTO v_next
            FROM gpupool_reservations WHERE state = 'waiting' AND id <> v_head.id
            ORDER BY priority DESC, seq, id LIMIT 1 FOR UPDATE;
            PERFORM 1 FROM gpupool_meta WHERE key = 'queue_gate_hold_seq' FOR UPDATE;
            v_spent := v_head.overtakes >= coalesce((SELECT value FROM gpupool_meta WHERE key = 'queue_gate_bound'), 0);
            v_head_request := v_head.request::json;
            v_usable := (SELECT count(*) FROM gpupool_gpus WHERE node = v_res.node);
            -- The pass published which nodes the first request fits empty, for this request's shape.
            IF coalesce((SELECT value FROM gpupool_meta WHERE key = 'queue_gate_open'), 0) <> 1
               OR hashtext(v_head.request) IS DISTINCT FROM
                  (SELECT value FROM gpupool_meta WHERE key = 'queue_head_shape')
               OR v_head.deadline <= p_now
               -- What it leaves of the node fits no waiting request: the pass would grant nothing more.
               OR v_usable - (v_head_request ->> 'gpus')::integer >= coalesce(
                      (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_min_gpus'), 0)
               OR (v_usable > (v_head_request ->> 'gpus')::integer AND coalesce(
                      (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_min_milli'), 0) <= 1000) THEN
                outcome := 'serialize';
                RETURN;
            END IF;
            IF v_spent THEN
                -- The pass held a node for it; the hold passes to the next request if a pass would
                -- hold that node for it too: spent, of the same shape, not overdue (or none waits).
                IF (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_hold_priority') IS DISTINCT FROM v_head.priority
                   OR (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_hold_seq') IS DISTINCT FROM v_head.seq
                   OR (v_next.id IS NOT NULL AND (
                        v_next.request <> v_head.request OR v_next.deadline <= p_now
                        OR v_next.overtakes < (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_bound'))) THEN
                    outcome := 'serialize';
                    RETURN;
                END IF;
                -- (Skipped while another writer holds its row: no two writers wait on each other's.)
                SELECT name INTO v_held FROM gpupool_nodes WHERE held_for = v_head.id FOR UPDATE SKIP LOCKED;
                IF NOT FOUND OR v_held = v_res.node THEN
                    outcome := 'serialize';
                    RETURN;
                END IF;
            END IF;
            SELECT array_agg(idx ORDER BY idx), min(memory_mib) INTO v_taken, handed_gmem FROM (
                SELECT idx, memory_mib FROM gpupool_gpus WHERE node = v_res.node
                ORDER BY idx LIMIT (v_head_request ->> 'gpus')::integer
            ) AS first_free;
            handed_to := v_head.id;
        END IF;
    END IF;
    UPDATE gpupool_reservations SET state = 'released', ended_at = p_now, message = p_message
    WHERE id = p_id AND state = 'granted';
    IF NOT FOUND THEN
        outcome := 'serialize';
        RETURN;
    END IF;
    v_request := v_res.request::json;
    v_xid := pg_current_xact_id()::text::bigint;
    UPDATE gpupool_nodes SET
        cpu_free = cpu_free + (v_request ->> 'cpu_milli')::bigint,
        memory_free = memory_free + (v_request ->> 'memory_mib')::bigint,
        n_training = n_training - (v_res.workload_class = 'training')::integer,
        n_inference = n_inference - (v_res.workload_class = 'inference')::integer,
        version = v_xid
    WHERE name = v_res.node
    RETURNING n_training, n_inference INTO node_training, node_inference;
    IF v_res.mig_slice IS NOT NULL THEN
        UPDATE gpupool_mig_slices SET holder = NULL WHERE node = v_res.node AND slice_id = v_res.mig_slice;
    ELSE
        UPDATE gpupool_gpus SET
            free_milli = free_milli + v_res.milli_per_gpu,
            free_memory_mib = free_memory_mib + v_res.gpu_memory_mib
        WHERE node = v_res.node
          AND idx IN (SELECT value::integer FROM json_array_elements_text(v_res.gpu_indices::json));
    END IF;
    -- Handed over: the queue's first request takes the emptied node, and its hold passes on.
    IF handed_to IS NOT NULL THEN
        UPDATE gpupool_nodes SET
            cpu_free = cpu_free - (v_head_request ->> 'cpu_milli')::bigint,
            memory_free = memory_free - (v_head_request ->> 'memory_mib')::bigint,
            n_training = n_training + (v_head.workload_class = 'training')::integer,
            n_inference = n_inference + (v_head.workload_class = 'inference')::integer
        WHERE name = v_res.node
        RETURNING n_training, n_inference INTO node_training, node_inference;
        UPDATE gpupool_gpus SET free_milli = free_milli - 1000, free_memory_mib = free_memory_mib - handed_gmem
        WHERE node = v_res.node AND idx = ANY (v_taken);
        UPDATE gpupool_reservations SET
            state = 'granted', granted_at = p_now, expires_at = p_now + ttl, node = v_res.node,
            gpu_indices = array_to_json(v_taken)::text, milli_per_gpu = 1000, gpu_memory_mib = handed_gmem,
            mig_slice = NULL, message = NULL
        WHERE id = v_head.id;
        IF v_spent THEN
            UPDATE gpupool_nodes SET held_for = v_next.id, version = v_xid WHERE name = v_held;
            UPDATE gpupool_meta SET value = CASE key
                WHEN 'queue_gate_hold_priority' THEN coalesce(v_next.priority, -4611686018427387904)
                ELSE coalesce(v_next.seq, 0) END
            WHERE key IN ('queue_gate_hold_priority', 'queue_gate_hold_seq');
            INSERT INTO gpupool_meta (key, value) VALUES ('spent_queue_version', v_xid)
            ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;
        END IF;
        PERFORM pg_notify('gpupool_' || current_schema(), v_head.id);
        handed_request := v_head.request;
        handed_indices := array_to_json(v_taken)::text;
    END IF;
    -- What was given back, so the caller's copy of the capacity can give it back too.
    outcome := 'released';
    released_request := v_res.request;
    released_node := v_res.node;
    released_indices := v_res.gpu_indices;
    released_milli := v_res.milli_per_gpu;
    released_gmem := v_res.gpu_memory_mib;
    released_slice := v_res.mig_slice;
END
$$;
"""

_WAIT = """
CREATE OR REPLACE FUNCTION gpupool_wait(
    p_id text, p_holder text, p_request text, p_priority integer, p_team text, p_class text,
    p_now double precision, p_timeout double precision, p_ttl double precision, p_generation bigint,
    p_gpus integer, p_milli integer, p_preempts boolean,
    OUT outcome text, OUT queued_at double precision, OUT queued_seq bigint, OUT ahead bigint
) LANGUAGE plpgsql AS $$
DECLARE
    v_xid bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(__LOCK_KEY__, hashtext(current_schema()));
    p_now := coalesce(p_now, extract(epoch FROM clock_timestamp())::float8);
    queued_at := p_now;
    -- Queued without a pass only where the gate stays what it is (ledger.gate): it is open, a
    -- request of no larger shape already waits, and no overtake budget is spent on arrival.
    IF coalesce((SELECT value FROM gpupool_meta WHERE key = 'queue_gate_open'), 0) <> 1
       OR coalesce((SELECT value FROM gpupool_meta WHERE key = 'queue_gate_bound'), 0) <= 0
       OR (p_milli IS NULL AND p_gpus < coalesce(
               (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_min_gpus'), 1073741824))
       OR (p_milli IS NOT NULL AND p_milli < coalesce(
               (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_min_milli'), 1073741824))
       OR EXISTS (SELECT 1 FROM gpupool_reservations WHERE state = 'granted' AND expires_at < p_now)
       OR (SELECT value FROM gpupool_meta WHERE key = 'inventory_generation') IS DISTINCT FROM p_generation
       OR EXISTS (SELECT 1 FROM gpupool_reservations WHERE id = p_id) THEN
        outcome := 'serialize';
        RETURN;
    END IF;
    -- A preemptor with a possible victim goes through a pass, which offers it one.
    IF p_preempts AND EXISTS (
            SELECT 1 FROM gpupool_reservations WHERE state = 'granted' AND preempt_deadline IS NULL
            AND gang_id IS NULL AND strpos(request, '"preemptible": true') > 0) THEN
        outcome := 'serialize';
        RETURN;
    END IF;
    -- It must fit no node, held ones included; counted on GPU compute alone, which errs towards
    -- the serialized path (memory, CPU, models and labels only refuse more).
    IF p_milli IS NULL AND EXISTS (
            SELECT 1 FROM gpupool_gpus WHERE NOT partitioned AND free_milli >= 1000
            GROUP BY node HAVING count(*) >= p_gpus)
       OR p_milli IS NOT NULL AND EXISTS (
            SELECT 1 FROM gpupool_gpus WHERE NOT partitioned AND free_milli >= p_milli) THEN
        outcome := 'serialize';
        RETURN;
    END IF;
    v_xid := pg_current_xact_id()::text::bigint;
    INSERT INTO gpupool_reservations (
        id, holder, request, priority, seq, state, team, workload_class, created_at, deadline, ttl, overtakes
    ) VALUES (
        p_id, p_holder, p_request, p_priority, v_xid, 'waiting', p_team, p_class, p_now, p_now + p_timeout,
        p_ttl, 0
    ) ON CONFLICT (id) DO NOTHING;
    IF NOT FOUND THEN
        outcome := 'serialize';
        RETURN;
    END IF;
    -- Its budget is not spent: grants past the queue at or below its priority count its overtakes.
    UPDATE gpupool_meta SET value = p_priority
    WHERE key = 'queue_gate_unspent_priority' AND value < p_priority;
    SELECT count(*) INTO ahead FROM gpupool_reservations
    WHERE state = 'waiting' AND (priority > p_priority OR (priority = p_priority AND seq < v_xid)
                                 OR (priority = p_priority AND seq = v_xid AND id < p_id));
    queued_seq := v_xid;
    outcome := 'waiting';
END
$$;
"""

# The shared side of the lock the serialized path takes exclusively.
FUNCTIONS = tuple(ddl.replace("__LOCK_KEY__", str(ADVISORY_LOCK_KEY)) for ddl in (_TAKE, _GIVE_BACK, _WAIT))


# v5 renamed an argument and added a result column, which CREATE OR REPLACE refuses.
_DROP = (
    "DROP FUNCTION IF EXISTS gpupool_take",
    "DROP FUNCTION IF EXISTS gpupool_give_back",
    "DROP FUNCTION IF EXISTS gpupool_wait",
)


def reinstall(conn: Connection) -> None:
    """Drop the functions and create them again (a migration that changes their signatures)."""
    for ddl in _DROP:
        conn.exec_driver_sql(ddl)
    install(conn)


def install(conn: Connection) -> None:
    """Create or replace the functions in the ledger's schema (the first of the search path)."""
    for ddl in FUNCTIONS:
        conn.exec_driver_sql(ddl)
