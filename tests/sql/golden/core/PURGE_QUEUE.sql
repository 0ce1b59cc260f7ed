DELETE FROM pgqueue_message WHERE queue = %s
