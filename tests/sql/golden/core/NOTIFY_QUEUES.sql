SELECT pg_notify(%s, queue) FROM unnest(%s::text[]) AS q(queue)
