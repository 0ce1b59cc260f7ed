SELECT t.name, c.reltuples::bigint,
       CASE WHEN c.reltuples < 2 * %(cap)s THEN (
           CASE t.name
               WHEN 'live' THEN (SELECT count(*) FROM (
                   SELECT 1 FROM pgqueue_message LIMIT %(cap)s + 1) x)
               WHEN 'archive' THEN (SELECT count(*) FROM (
                   SELECT 1 FROM pgqueue_archive LIMIT %(cap)s + 1) x)
               ELSE (SELECT count(*) FROM (SELECT 1 FROM pgqueue_dead LIMIT %(cap)s + 1) x)
           END) END
FROM (VALUES ('live', 'pgqueue_message'), ('archive', 'pgqueue_archive'),
             ('dead', 'pgqueue_dead')) AS t(name, relation)
JOIN pg_class c ON c.oid = to_regclass(t.relation)
