chosen AS (
    SELECT id, lease_token, locked, row_number() OVER () AS k FROM candidate
)
