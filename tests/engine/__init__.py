"""``tasks_app.engine``: enqueue, claims under fenced leases, how attempts end, the runner
and its worker processes, doorbells, the sweeper, the effects ledger and the SQL fast path
against the ORM."""
