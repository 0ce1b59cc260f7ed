key_room AS (
    SELECT NULL::text AS key, 0 AS room WHERE %(key_limit)s::int IS NOT NULL
)
