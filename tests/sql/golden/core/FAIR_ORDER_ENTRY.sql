GREATEST(
    COALESCE((SELECT h.fair_order FROM pgqueue_message h
              WHERE h.queue = {queue} AND h.priority = {priority} AND h.fair_order >= 0
              ORDER BY h.fair_order LIMIT 1), 0),
    (SELECT t.fair_order + {step} FROM pgqueue_message t
     WHERE t.queue = {queue} AND t.tenant = {tenant} AND t.priority = {priority}
       AND t.fair_order >= 0
     ORDER BY t.fair_order DESC LIMIT 1),
    (SELECT t.fair_order + {step} FROM pgqueue_message t
     WHERE {tenant} IS NULL AND t.queue = {queue} AND t.tenant IS NULL
       AND t.priority = {priority} AND t.fair_order >= 0
     ORDER BY t.fair_order DESC LIMIT 1))
