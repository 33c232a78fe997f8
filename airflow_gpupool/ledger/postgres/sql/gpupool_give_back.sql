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
    -- Unknown, or already ended: the serialized path says which. A gang's members end together there,
    -- and a preemption victim (or a revoked grant) ends there as preempted; an upstream with
    -- requests queued ahead of it ends there, keeping or withdrawing them (ledger.grants.queue_ahead).
    IF NOT FOUND OR v_res.state <> 'granted' OR v_res.gang_id IS NOT NULL
       OR v_res.preempt_deadline IS NOT NULL OR v_res.ahead_planned IS NOT NULL THEN
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
               OR v_node.suspect_since IS NOT NULL
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
