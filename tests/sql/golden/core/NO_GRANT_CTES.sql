granted AS (
    SELECT 0 AS allowance WHERE false
)
