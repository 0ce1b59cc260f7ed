save_places AS (
    UPDATE pgqueue_message m SET fair_order = p.place
    FROM placed p
    -- By primary key whatever the plan, as LEASE's ``claimed``.
    WHERE m.id = ANY(ARRAY(SELECT id FROM placed)) AND m.id = p.id
      AND p.id <> ALL(ARRAY(SELECT id FROM chosen))
      AND (m.fair_order < 0 OR m.fair_order IS NULL) AND m.available_at <= now()
)
