leases AS (
    SELECT count(*) FILTER (WHERE available_at > now())::int AS held,
           count(*)::int AS members
    FROM pgqueue_message
    WHERE queue = %(queue)s AND lease_token IS NOT NULL AND fair_order < 0 AND %(counted)s::boolean
)
