uncapped AS (
    SELECT %(key_rate)s::float8 IS NULL
           AND COALESCE(%(least_key_limit)s::int - (SELECT held FROM state)
                        >= (SELECT n FROM budget), true) AS ok
), short AS (
    SELECT count(DISTINCT key)::int AS n FROM key_room WHERE room < (SELECT n FROM budget)
), reach AS (
    SELECT CASE WHEN (SELECT ok FROM uncapped) THEN 0
                WHEN %(key_limit)s::int - (SELECT credits FROM state) < (SELECT n FROM budget)
                     OR (SELECT n FROM short) > 0
                THEN (SELECT n FROM budget) + 2 * (SELECT n FROM short) + %(window)s::int
                ELSE 0 END AS n
)
