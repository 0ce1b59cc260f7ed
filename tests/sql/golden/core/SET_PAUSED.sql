INSERT INTO pgqueue_queue (name, paused, updated_at) VALUES (%s, %s, now())
ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now()
