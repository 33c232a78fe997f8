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
    -- A suspect node (ledger/nodes/suspects.py) takes no grant until a sync clears it.
    IF NOT FOUND OR v_node.health <> 'healthy' OR v_node.suspect_since IS NOT NULL
       OR v_node.cpu_free < p_cpu OR v_node.memory_free < p_mem
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
