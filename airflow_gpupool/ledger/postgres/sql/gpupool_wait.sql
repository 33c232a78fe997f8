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
