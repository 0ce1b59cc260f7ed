chosen AS (
    SELECT id, lease_token, locked, row_number() OVER (ORDER BY priority DESC, place, id) AS k
    FROM candidate
    ORDER BY priority DESC, place, id
    LIMIT (SELECT n FROM budget)
)
