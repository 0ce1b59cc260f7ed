-- As pgq_owner, in the application's database, before `manage.py migrate`.
-- The app may use the schema:
GRANT USAGE ON SCHEMA public TO pgq_app;
-- Every table and sequence pgq_owner creates from now on (migrations, and the archive's day
-- partitions that pgq_prune --partitions-only creates every day) is readable and writable
-- by pgq_app:
ALTER DEFAULT PRIVILEGES FOR ROLE pgq_owner IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO pgq_app;
ALTER DEFAULT PRIVILEGES FOR ROLE pgq_owner IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO pgq_app;
-- The tables and sequences that exist already (a database migrated before these grants):
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO pgq_app;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO pgq_app;
