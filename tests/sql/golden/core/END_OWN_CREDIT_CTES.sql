own_credit_ended AS (
    DELETE FROM pgqueue_flow_credit
    WHERE queue = %(queue)s AND holder = %(holder)s AND %(key_rate)s::float8 IS NULL
)
