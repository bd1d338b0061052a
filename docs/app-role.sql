-- The role the web and worker processes connect as (docs/deployment.md, "Database roles").
-- It owns nothing: migrations run as the tables' owner (the release step), the processes
-- as this role. Without ownership it cannot drop or disable a trigger, and it is granted
-- no UPDATE, DELETE or TRUNCATE on the history: the history's rows go only through
-- tasks_app_prune_events, which runs as the owner and takes only what retention may.
-- Run as the tables' owner after `manage.py migrate`, and again after each release that
-- adds a table (or keep the ALTER DEFAULT PRIVILEGES lines, which cover new ones).
-- Replace task_console_app with the role's name; give it a password or another login.

CREATE ROLE task_console_app LOGIN;
GRANT USAGE ON SCHEMA public TO task_console_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO task_console_app;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO task_console_app;
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO task_console_app;
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO task_console_app;
-- The history: appended to and read, never changed.
REVOKE UPDATE, DELETE ON tasks_app_event, tasks_app_auditcheckpoint FROM task_console_app;
GRANT EXECUTE ON FUNCTION tasks_app_prune_events(bigint[]) TO task_console_app;
