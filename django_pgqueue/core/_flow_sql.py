"""The SQL of flow control (``_flow_control.py``): small functions, created by the migration.

A queue with fairness, limits or rates is claimed by ``_claim_sql.FLOW_CLAIM``, whose
candidates come from
``pgq_flow_candidates(queue, wanted, exact, settings, levels, bounds, after)``: the
messages to lease, locked, in the order to lease them, each with its place in the fair order.
It is PL/pgSQL because its steps depend on each other: under READ COMMITTED every statement
in it takes a fresh snapshot, so after it has waited for the queue's lock it sees everything
committed before that. ``settings`` is the queue's settings as JSON
(``FlowConfig.settings_json``), so one prepared claim text serves every flow-controlled queue;
each step reads from it what it needs.

It runs four steps, each a function of its own below it (see ``docs/explanation/design.md``,
"Fair queues and limits"):

1. **look**: a paused queue gives nothing; the same query probes (two index probes) whether a
   message outside the fair order has fallen due (a retry, a scheduled message, an expired
   lease);
2. **room**: a queue with limits or rates leases under the session's *allowance* when it has
   one (a share of the room under every limit and of the rate's tokens, reserved for a
   fraction of a second, ``pgqueue_flow_allowance``), counting nothing; otherwise it claims
   *exactly*: ``pgq_flow_count_room`` takes the queue's advisory lock, counts what is in
   flight and gives the room every limit leaves (a ``pgq_flow_room``);
3. **pick**: the head of the plain claim order, or ``pgq_flow_fair``: the head of the fair
   order, where what fell due outside it (``pgq_flow_due``) competes at the place it takes
   there and tenants are kept within their limits (``pgq_flow_choose``). The fair order is
   walked from the claimer's bounds when it gives some (``levels``, ``bounds``, ``after``: a
   place and an id per priority level, see ``core/_claim_bound.py``), else from its head
   (``pgq_flow_head``);
4. **book**: what an allowance did not lease goes back to it; an exact claim spends the
   rate's tokens and reserves the session's next allowance (``pgq_flow_reserve``).

Why the limits hold: exact claims take turns (the queue's advisory lock, held until they
commit), and the room one takes or reserves is the limit minus the leases in flight minus
the units of the other sessions' allowances. It reads those units before it counts the
leases, each in a snapshot of its own: a claim under an allowance takes its batch out of its
units in the same transaction as its leases, so whether it commits before, between or after
those two reads, its messages are counted once or twice, never missed. An allowance counts
against the queue limit and against each key's limit (all of it may go to one tenant).
Expired allowances are settled by the next exact claim: their unused units stop counting and
their tokens go back to the rate.
"""

from __future__ import annotations

from ._sql import FAIR_ORDER_ENTRY

#: The first key of the queues' advisory locks (the second is the queue name's hash).
LOCK_CLASS = 0x70677100

CANDIDATES_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_flow_candidates(
    p_queue text, p_wanted int, p_exact boolean, p_settings jsonb,
    p_levels smallint[], p_bounds float8[], p_after bigint[])
RETURNS TABLE (id bigint, lease_token uuid, place float8)
LANGUAGE plpgsql VOLATILE
AS $fn$
#variable_conflict use_column
DECLARE
    keyed constant boolean := coalesce((p_settings ->> 'keyed')::boolean, false);
    limited constant boolean := p_settings ->> 'queue_limit' IS NOT NULL
                                OR p_settings ->> 'rate' IS NOT NULL
                                OR p_settings ->> 'key_limit' IS NOT NULL
                                OR coalesce(p_settings -> 'key_limits', '{}') <> '{}'
                                OR p_settings ->> 'key_rate' IS NOT NULL;
    room pgq_flow_room := ROW(p_wanted, false, 0, 0, NULL, NULL, '{}')::pgq_flow_room;
    paused boolean;
    due_waiting boolean;
    under_allowance boolean := false;
    exact boolean := false;
    taken int := 0;
BEGIN
    -- 1. Look: paused, and (a fair queue) whether something fell due outside the fair order
    -- (a retry, a scheduled message, an expired lease): two index probes.
    SELECT EXISTS (SELECT 1 FROM pgqueue_queue q WHERE q.name = p_queue AND q.paused),
           keyed AND (
               EXISTS (SELECT 1 FROM pgqueue_message m
                       WHERE m.queue = p_queue AND m.fair_order < 0 AND m.lease_token IS NULL
                         AND m.attempts < m.max_attempts AND m.available_at <= now())
               OR EXISTS (SELECT 1 FROM pgqueue_message m
                          WHERE m.queue = p_queue AND m.fair_order < 0
                            AND m.lease_token IS NOT NULL AND m.available_at <= now()
                            AND m.attempts < m.max_attempts))
    INTO paused, due_waiting;
    IF paused THEN
        RETURN;
    END IF;

    -- 2. Room: under the session's allowance while it holds the whole batch (taken out of it
    -- at once, what is not leased given back in step 4), else counted exactly: an allowance
    -- never makes a claim come back short.
    IF limited AND NOT p_exact THEN
        UPDATE pgqueue_flow_allowance a SET units = a.units - p_wanted
        WHERE a.queue = p_queue AND a.holder = pg_backend_pid() AND a.units >= p_wanted
          AND a.until > clock_timestamp();
        under_allowance := FOUND;
    END IF;
    IF limited AND NOT under_allowance THEN
        exact := true;
        room := pgq_flow_count_room(p_queue, p_wanted, p_settings);
    END IF;

    -- 3. Pick: the head of the plain claim order, or of the fair order.
    IF room.budget > 0 AND NOT keyed THEN
        RETURN QUERY
        SELECT m.id, m.lease_token, NULL::float8 FROM pgqueue_message m
        WHERE m.queue = p_queue AND m.attempts < m.max_attempts AND m.available_at <= now()
        ORDER BY m.priority DESC, m.available_at, m.id
        LIMIT room.budget
        FOR UPDATE SKIP LOCKED;
        GET DIAGNOSTICS taken = ROW_COUNT;
    ELSIF room.budget > 0 THEN
        RETURN QUERY
        SELECT f.id, f.lease_token, f.place
        FROM pgq_flow_fair(p_queue, p_settings, room, due_waiting, exact,
                           p_levels, p_bounds, p_after) f;
        GET DIAGNOSTICS taken = ROW_COUNT;
    END IF;

    -- 4. Book: an allowance gets back what it did not lease; an exact claim spends the
    -- rate's tokens and, when it took its whole batch outside the caller's transaction,
    -- reserves the session's next allowance.
    IF under_allowance AND taken < p_wanted THEN
        UPDATE pgqueue_flow_allowance a SET units = a.units + p_wanted - taken
        WHERE a.queue = p_queue AND a.holder = pg_backend_pid();
    ELSIF exact THEN
        PERFORM pgq_flow_reserve(p_queue, p_settings, room, taken,
                                 NOT p_exact AND taken = p_wanted);
    END IF;
END
$fn$;
"""

# The room an exact claim has: what the queue's limits and rate leave now, counted under the
# queue's advisory lock (the exact claims take turns until they commit).
ROOM_TYPE = """
DO $$ BEGIN
    CREATE TYPE pgq_flow_room AS (
        budget int,        -- how many this claim may lease
        per_key boolean,   -- whether each tenant's room must be looked at (pgq_flow_choose)
        in_flight int,     -- the queue's leases in flight
        reserved int,      -- the units of the other sessions' allowances
        tokens int,        -- the rate's whole tokens (NULL: no rate)
        key_room int,      -- the room of the tenant closest to its limit (NULL: no key limit)
        busy jsonb);       -- tenant -> leases in flight (with key limits or a key rate)
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
"""

# Step 2 of an exact claim: take the queue's turn, settle the allowances that ended, and
# count the room under every limit and the rate, each read in a snapshot of its own.
COUNT_ROOM_FUNCTION = f"""
CREATE OR REPLACE FUNCTION pgq_flow_count_room(p_queue text, p_wanted int, p_settings jsonb)
RETURNS pgq_flow_room
LANGUAGE plpgsql VOLATILE
AS $fn$
#variable_conflict use_column
DECLARE
    queue_limit constant int := (p_settings ->> 'queue_limit')::int;
    key_limit constant int := (p_settings ->> 'key_limit')::int;
    key_limits constant jsonb := coalesce(p_settings -> 'key_limits', '{{}}');
    rate constant float8 := (p_settings ->> 'rate')::float8;
    key_rate constant float8 := (p_settings ->> 'key_rate')::float8;
    room pgq_flow_room := ROW(p_wanted, false, 0, 0, NULL, NULL, '{{}}')::pgq_flow_room;
    returned int;
BEGIN
    PERFORM pg_advisory_xact_lock({LOCK_CLASS}, hashtext(p_queue));
    -- Settle the allowances that ended (and this session's own, replaced in step 4): their
    -- unused units no longer count, their tokens go back to the rate. One a claim is using
    -- right now is left for the next exact claim, and counted meanwhile.
    WITH settled AS (
        DELETE FROM pgqueue_flow_allowance a
        WHERE (a.queue, a.holder) IN (
            SELECT e.queue, e.holder FROM pgqueue_flow_allowance e
            WHERE e.queue = p_queue
              AND (e.until <= clock_timestamp() OR e.holder = pg_backend_pid())
            FOR UPDATE SKIP LOCKED)
        RETURNING a.units
    )
    SELECT coalesce(sum(units), 0) INTO returned FROM settled;
    -- The other allowances as last committed, read before the leases are counted: a claim
    -- under one that commits in between is counted twice (its units and its leases), never
    -- missed.
    SELECT coalesce(sum(a.units), 0) INTO room.reserved FROM pgqueue_flow_allowance a
    WHERE a.queue = p_queue AND a.units > 0;
    IF rate IS NOT NULL THEN
        IF returned > 0 THEN
            UPDATE pgqueue_flow_rate r
            SET tat = r.tat - make_interval(secs => returned / rate)
            WHERE r.queue = p_queue AND r.key = '';
        END IF;
        room.tokens := pgq_flow_tokens(
            (SELECT r.tat FROM pgqueue_flow_rate r WHERE r.queue = p_queue AND r.key = ''),
            clock_timestamp(), rate);
        room.budget := least(room.budget, room.tokens);
    END IF;
    -- The leases in flight (and, with key limits or a key rate, each tenant's): one pass.
    IF key_limit IS NOT NULL OR key_limits <> '{{}}' OR key_rate IS NOT NULL THEN
        SELECT coalesce(sum(b.n), 0),
               coalesce(jsonb_object_agg(b.tenant, b.n) FILTER (WHERE b.tenant IS NOT NULL),
                        '{{}}')
        INTO room.in_flight, room.busy
        FROM (SELECT m.tenant, count(*) AS n FROM pgqueue_message m
              WHERE m.queue = p_queue AND m.lease_token IS NOT NULL AND m.fair_order < 0
                AND m.available_at > now()
              GROUP BY m.tenant) b;
    ELSIF queue_limit IS NOT NULL THEN
        SELECT count(*) INTO room.in_flight FROM pgqueue_message m
        WHERE m.queue = p_queue AND m.lease_token IS NOT NULL AND m.fair_order < 0
          AND m.available_at > now();
    END IF;
    IF key_limit IS NOT NULL OR key_limits <> '{{}}' THEN
        -- The room of the tenant closest to its limit, in flight or not.
        SELECT least(
                   min(coalesce((key_limits ->> b.key)::int, key_limit, 2147483647)
                       - b.value::int),
                   (SELECT min(l.value::int) FROM jsonb_each_text(key_limits) l),
                   key_limit)
        INTO room.key_room
        FROM jsonb_each_text(room.busy) b;
    END IF;
    -- Each tenant's room is looked at only when some tenant could reach its limit with this
    -- batch (or has a rate): else the fair head is the choice as it is.
    room.per_key := key_rate IS NOT NULL
                    OR coalesce(room.key_room - room.reserved < room.budget, false);
    IF queue_limit IS NOT NULL THEN
        room.budget := least(room.budget, queue_limit - room.in_flight - room.reserved);
    END IF;
    room.budget := greatest(room.budget, 0);
    RETURN room;
END
$fn$;
"""

# Step 3 of a fair queue: at most ``p_room.budget`` messages, locked, in fair order. The head
# as is, unless messages from outside the order compete for the batch, or an exact claim must
# keep each tenant within its key limit and rate (``p_room.per_key``). Rows written without a
# place (raw SQL, or from before fairness was switched on) are looked for among the oldest
# ready ones by one claim in 20, and by any claim that comes back short. With a key rate, an
# exact claim (``p_exact``) spends the tokens of the tenants it took.
FAIR_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_flow_fair(
    p_queue text, p_settings jsonb, p_room pgq_flow_room, p_due_waiting boolean,
    p_exact boolean, p_levels smallint[], p_bounds float8[], p_after bigint[])
RETURNS TABLE (id bigint, lease_token uuid, place float8)
LANGUAGE plpgsql VOLATILE
AS $fn$
#variable_conflict use_column
DECLARE
    budget constant int := p_room.budget;
    weights constant jsonb := coalesce(p_settings -> 'weights', '{}');
    taken int := 0;
    due pgq_flow_candidate[] := '{}';
    chosen pgq_flow_candidate[] := '{}';
BEGIN
    IF p_due_waiting OR random() < 0.05 THEN
        due := ARRAY(SELECT d FROM pgq_flow_due(
            p_queue, weights, CASE WHEN p_due_waiting THEN budget + 32 ELSE 0 END, 32) d);
    END IF;
    IF cardinality(due) = 0 AND NOT p_room.per_key THEN
        RETURN QUERY
        SELECT h.id, h.lease_token, h.place
        FROM pgq_flow_head(p_queue, budget, p_levels, p_bounds, p_after) h;
        GET DIAGNOSTICS taken = ROW_COUNT;
        IF taken < budget THEN
            -- Short of the batch: rows written without a place among the oldest ready ones.
            due := ARRAY(SELECT d FROM pgq_flow_due(p_queue, weights, 0, 32) d);
            chosen := ARRAY(SELECT d FROM unnest(due) d
                            ORDER BY d.priority DESC, d.place, d.id
                            LIMIT budget - taken);
        END IF;
    ELSE
        chosen := pgq_flow_choose(p_queue, p_settings, p_room, due, p_levels, p_bounds, p_after);
        IF cardinality(chosen) < budget THEN
            due := due || ARRAY(SELECT d FROM pgq_flow_due(p_queue, weights, 0, 32) d);
            chosen := pgq_flow_choose(p_queue, p_settings, p_room, due,
                                      p_levels, p_bounds, p_after);
        END IF;
    END IF;
    IF cardinality(due) > 0 THEN
        -- The candidates from outside the order not leased now keep their place.
        UPDATE pgqueue_message m SET fair_order = d.place
        FROM unnest(due) d
        WHERE m.id = ANY(ARRAY(SELECT u.id FROM unnest(due) u)) AND m.id = d.id
          AND m.id <> ALL(ARRAY(SELECT c.id FROM unnest(chosen) c));
    END IF;
    IF p_exact AND p_settings ->> 'key_rate' IS NOT NULL THEN
        PERFORM pgq_flow_spend_keys(p_queue, ARRAY(SELECT c.tenant FROM unnest(chosen) c),
                                    (p_settings ->> 'key_rate')::float8);
    END IF;
    RETURN QUERY SELECT c.id, c.lease_token, c.place FROM unnest(chosen) c;
END
$fn$;
"""

# Step 4 of an exact claim: the rate's tokens spent, for what it took and for the session's
# next allowance. That allowance (``p_may_grant``: the claim took its whole batch, outside
# the caller's transaction) is a quarter of what is left under every limit and of the rate's
# tokens, so that a few sessions hold one at once; none with a key rate (its tokens are per
# tenant). ``least`` passes over the NULL of a limit the queue does not have.
RESERVE_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_flow_reserve(
    p_queue text, p_settings jsonb, p_room pgq_flow_room, p_taken int, p_may_grant boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
#variable_conflict use_column
DECLARE
    rate constant float8 := (p_settings ->> 'rate')::float8;
    allowance_claims constant int := coalesce((p_settings ->> 'allowance_claims')::int, 0);
    granted int := 0;
BEGIN
    IF p_may_grant AND allowance_claims > 0 AND p_settings ->> 'key_rate' IS NULL THEN
        granted := greatest(0, least(
            allowance_claims * p_taken,
            ((p_settings ->> 'queue_limit')::int - p_room.in_flight - p_room.reserved
             - p_taken) / 4,
            (p_room.key_room - p_room.reserved - p_taken) / 4,
            (p_room.tokens - p_taken) / 4));
    END IF;
    IF granted > 0 THEN
        INSERT INTO pgqueue_flow_allowance AS a (queue, holder, units, until)
        VALUES (p_queue, pg_backend_pid(), granted,
                clock_timestamp() + make_interval(
                    secs => coalesce((p_settings ->> 'allowance_window')::float8, 0)))
        ON CONFLICT (queue, holder) DO UPDATE SET units = excluded.units, until = excluded.until;
    END IF;
    IF rate IS NOT NULL AND p_taken + granted > 0 THEN
        INSERT INTO pgqueue_flow_rate AS r (queue, key, tat)
        VALUES (p_queue, '', clock_timestamp() + make_interval(secs => (p_taken + granted) / rate))
        ON CONFLICT (queue, key) DO UPDATE
        SET tat = greatest(r.tat, clock_timestamp())
                  + make_interval(secs => (p_taken + granted) / rate);
    END IF;
END
$fn$;
"""

# A candidate of a fair claim: a message with its place in the fair order.
CANDIDATE_TYPE = """
DO $$ BEGIN
    CREATE TYPE pgq_flow_candidate AS (
        id bigint, lease_token uuid, tenant text, priority smallint, place float8);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
"""

# The head of the fair order, locked ``SKIP LOCKED``, at most ``p_reach`` messages in fair
# order: walked from the index head, or (``p_levels`` not empty) each priority level walked from
# its bound (``p_bounds``: a place in the fair order, ``p_after``: the id the walk starts from at
# that place; core/_claim_bound.py), highest first, one index seek each, so that the dead
# entries below a bound are never read. The bounded walk has no outer ORDER BY: the levels come
# in the order given and each walk in index order, and the outer LIMIT stops the walks, and
# their locks, once it is reached.
HEAD_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_flow_head(
    p_queue text, p_reach int, p_levels smallint[], p_bounds float8[], p_after bigint[])
RETURNS SETOF pgq_flow_candidate
LANGUAGE plpgsql VOLATILE
AS $fn$
#variable_conflict use_column
BEGIN
    IF coalesce(cardinality(p_levels), 0) = 0 THEN
        RETURN QUERY
        SELECT m.id, m.lease_token, m.tenant::text, m.priority, m.fair_order
        FROM pgqueue_message m
        WHERE m.queue = p_queue AND m.fair_order >= 0
        ORDER BY m.priority DESC, m.fair_order, m.id
        LIMIT p_reach
        FOR UPDATE SKIP LOCKED;
    ELSE
        RETURN QUERY
        SELECT h.id, h.lease_token, h.tenant, h.priority, h.fair_order
        FROM unnest(p_levels, p_bounds, p_after) AS level(priority, bound, after_id)
        CROSS JOIN LATERAL (
            SELECT m.id, m.lease_token, m.tenant::text AS tenant, m.priority, m.fair_order
            FROM pgqueue_message m
            WHERE m.queue = p_queue AND m.priority = level.priority
              AND m.fair_order >= 0 AND (m.fair_order, m.id) >= (level.bound, level.after_id)
            ORDER BY m.fair_order, m.id
            LIMIT p_reach
            FOR UPDATE SKIP LOCKED) h
        LIMIT p_reach;
    END IF;
END
$fn$;
"""

# The fair choice: the head of the fair order (``pgq_flow_head``, from the bounds given) and
# the candidates from outside it (``p_due``, locked already), in fair order, at most
# ``p_room.budget``. When each tenant's room counts (``p_room.per_key``: key limits or a key
# rate), each tenant takes at most what it leaves: its limit less its leases in flight
# (``p_room.busy``) and the units of other sessions' allowances (``p_room.reserved``, each of
# which may go to any one tenant), and its rate's whole tokens. When that passes over some,
# the head is read again twice as far.
CHOOSE_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_flow_choose(
    p_queue text, p_settings jsonb, p_room pgq_flow_room, p_due pgq_flow_candidate[],
    p_levels smallint[], p_bounds float8[], p_after bigint[])
RETURNS pgq_flow_candidate[]
LANGUAGE plpgsql VOLATILE
AS $fn$
#variable_conflict use_column
DECLARE
    budget constant int := p_room.budget;
    key_limit constant int := (p_settings ->> 'key_limit')::int;
    key_limits constant jsonb := coalesce(p_settings -> 'key_limits', '{}');
    key_rate constant float8 := (p_settings ->> 'key_rate')::float8;
    reach int := budget;
    head pgq_flow_candidate[];
    chosen pgq_flow_candidate[];
BEGIN
    LOOP
        head := ARRAY(SELECT h FROM pgq_flow_head(p_queue, reach, p_levels, p_bounds,
                                                  p_after) h);
        IF NOT p_room.per_key THEN
            RETURN ARRAY(SELECT c FROM unnest(head || p_due) c
                         ORDER BY c.priority DESC, c.place, c.id
                         LIMIT budget);
        END IF;
        chosen := ARRAY(
            WITH candidate AS (
                SELECT * FROM unnest(head || p_due)
            ), tenant_room AS (
                SELECT t.tenant,
                       least(coalesce((key_limits ->> t.tenant)::int, key_limit, 2147483647)
                               - coalesce((p_room.busy ->> t.tenant)::int, 0) - p_room.reserved,
                             CASE WHEN key_rate IS NULL THEN 2147483647
                                  ELSE pgq_flow_tokens(r.tat, clock_timestamp(), key_rate)
                             END) AS n
                FROM (SELECT DISTINCT c.tenant FROM candidate c WHERE c.tenant IS NOT NULL) t
                LEFT JOIN pgqueue_flow_rate r
                       ON key_rate IS NOT NULL AND r.queue = p_queue AND r.key = t.tenant
            ), ranked AS (
                SELECT c.*, row_number() OVER (PARTITION BY c.tenant
                                               ORDER BY c.priority DESC, c.place, c.id) AS nth
                FROM candidate c
            )
            SELECT ROW(r.id, r.lease_token, r.tenant, r.priority, r.place)::pgq_flow_candidate
            FROM ranked r LEFT JOIN tenant_room k ON k.tenant = r.tenant
            WHERE r.tenant IS NULL OR r.nth <= k.n
            ORDER BY r.priority DESC, r.place, r.id
            LIMIT budget);
        -- Done when the batch is full, the head is read far enough, or it ran out.
        IF cardinality(chosen) >= budget OR reach > budget OR cardinality(head) < reach THEN
            RETURN chosen;
        END IF;
        reach := 2 * budget + 8;
    END LOOP;
END
$fn$;
"""

# Whole tokens a rate (GCRA) has left at ``p_now``: the burst (one second's worth, at least
# one) less how far the theoretical arrival time ``p_tat`` (NULL: none yet) is ahead of now.
# A plain expression, inlined where it is used.
TOKENS_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_flow_tokens(p_tat timestamptz, p_now timestamptz, p_rate float8)
RETURNS int
LANGUAGE sql IMMUTABLE
AS $fn$
    SELECT greatest(0, floor(greatest(1, p_rate) - p_rate * greatest(0, extract(epoch FROM
               coalesce(p_tat, p_now) - p_now)) + 1e-9))::int
$fn$;
"""

_DUE_ENTRY = FAIR_ORDER_ENTRY.format(
    queue="p_queue", priority="g.priority", tenant="g.tenant", step="g.step"
)
DUE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION pgq_flow_due(
    p_queue text, p_weights jsonb, p_due_limit int, p_unplaced_window int)
RETURNS SETOF pgq_flow_candidate
LANGUAGE plpgsql VOLATILE
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH due_again AS (
        SELECT * FROM (
            SELECT m.id, m.lease_token, m.tenant, m.priority, m.available_at
            FROM pgqueue_message m
            WHERE m.queue = p_queue AND m.fair_order < 0 AND m.lease_token IS NULL
              AND m.attempts < m.max_attempts AND m.available_at <= now()
            ORDER BY m.available_at, m.id
            LIMIT p_due_limit
            FOR UPDATE SKIP LOCKED) waiting
      UNION ALL
        SELECT * FROM (
            SELECT m.id, m.lease_token, m.tenant, m.priority, m.available_at
            FROM pgqueue_message m
            WHERE m.queue = p_queue AND m.fair_order < 0 AND m.lease_token IS NOT NULL
              AND m.available_at <= now() AND m.attempts < m.max_attempts
            ORDER BY m.available_at
            LIMIT p_due_limit
            FOR UPDATE SKIP LOCKED) expired
      UNION ALL
        SELECT * FROM (
            SELECT m.id, m.lease_token, m.tenant, m.priority, m.available_at
            FROM pgqueue_message m
            WHERE m.id = ANY(ARRAY(
                      SELECT o.id FROM (
                          SELECT m2.id, m2.fair_order FROM pgqueue_message m2
                          WHERE m2.queue = p_queue AND m2.attempts < m2.max_attempts
                            AND m2.available_at <= now()
                          ORDER BY m2.priority DESC, m2.available_at, m2.id
                          LIMIT p_unplaced_window) o
                      WHERE o.fair_order IS NULL))
              AND m.fair_order IS NULL
            FOR UPDATE SKIP LOCKED) unplaced
    ), entry AS (
        SELECT g.tenant, g.priority, g.step,
               {_DUE_ENTRY} AS place
        FROM (SELECT d.tenant, d.priority,
                     1.0::float8 / coalesce((p_weights ->> d.tenant)::int, 1) AS step
              FROM due_again d GROUP BY d.tenant, d.priority) g
    )
    SELECT d.id, d.lease_token, d.tenant::text, d.priority,
           e.place + (row_number() OVER (PARTITION BY d.tenant, d.priority
                                         ORDER BY d.available_at, d.id) - 1) * e.step
    FROM due_again d
    JOIN entry e ON e.tenant IS NOT DISTINCT FROM d.tenant AND e.priority = d.priority;
END
$fn$;
"""

# A key rate's tokens spent by the tenants of a claim (one entry per message), and the rows
# of up to 16 idle tenants (back to a full burst for a second or more) dropped, never those just
# spent: a tenant that claims now and then keeps its row.
SPEND_KEYS_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_flow_spend_keys(
    p_queue text, p_tenants text[], p_rate float8)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
#variable_conflict use_column
DECLARE
    t0 constant timestamptz := clock_timestamp();
BEGIN
    INSERT INTO pgqueue_flow_rate AS r (queue, key, tat)
    SELECT p_queue, s.tenant, t0 + make_interval(secs => s.n / p_rate)
    FROM (SELECT k.tenant, count(*) AS n FROM unnest(p_tenants) AS k(tenant)
          WHERE k.tenant IS NOT NULL GROUP BY k.tenant ORDER BY k.tenant) s
    ON CONFLICT (queue, key) DO UPDATE SET tat = greatest(r.tat, t0) + (excluded.tat - t0);
    DELETE FROM pgqueue_flow_rate r
    WHERE r.queue = p_queue AND r.key IN (
        SELECT i.key FROM pgqueue_flow_rate i
        WHERE i.queue = p_queue AND i.key <> '' AND i.tat <= t0 - interval '1 second'
          AND NOT i.key = ANY(array_remove(p_tenants, NULL))
        LIMIT 16);
END
$fn$;
"""


#: What the migration creates, each after those it uses: name -> definition.
DEFINITIONS = {
    "pgq_flow_candidate": CANDIDATE_TYPE,
    "pgq_flow_room": ROOM_TYPE,
    "pgq_flow_tokens": TOKENS_FUNCTION,
    "pgq_flow_due": DUE_FUNCTION,
    "pgq_flow_head": HEAD_FUNCTION,
    "pgq_flow_choose": CHOOSE_FUNCTION,
    "pgq_flow_spend_keys": SPEND_KEYS_FUNCTION,
    "pgq_flow_count_room": COUNT_ROOM_FUNCTION,
    "pgq_flow_fair": FAIR_FUNCTION,
    "pgq_flow_reserve": RESERVE_FUNCTION,
    "pgq_flow_candidates": CANDIDATES_FUNCTION,
}
_TYPES = ("pgq_flow_candidate", "pgq_flow_room")

#: What the migration's reverse runs.
DROP = (
    *(f"DROP FUNCTION IF EXISTS {name}" for name in reversed(DEFINITIONS) if name not in _TYPES),
    *(f"DROP TYPE IF EXISTS {name}" for name in reversed(_TYPES)),
)
