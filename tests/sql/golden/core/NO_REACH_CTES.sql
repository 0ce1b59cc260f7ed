reach AS (
    SELECT 0 AS n
)
