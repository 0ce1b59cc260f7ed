DELETE FROM pgqueue_worker WHERE worker_id = %s
