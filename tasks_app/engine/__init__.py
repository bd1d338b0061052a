"""The engine: creating tasks, claiming steps under fenced leases, running them, and settling how
each attempt ends; the doorbells, the sweeper and the SQL fast path."""
