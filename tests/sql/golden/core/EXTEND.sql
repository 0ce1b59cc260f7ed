UPDATE pgqueue_message m
SET available_at = now() + make_interval(secs => %s)
FROM unnest(%s::bigint[], %s::uuid[]) AS l(id, token)
WHERE m.id = l.id AND m.lease_token = l.token
RETURNING m.id, m.cancel_requested_at IS NOT NULL
