"""The engine: creating tasks, claiming steps under fenced leases, running them, and ending
each attempt through the step's state machine (``states``); the doorbells, the sweeper and
the SQL fast path."""
