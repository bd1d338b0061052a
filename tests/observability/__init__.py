"""``tasks_app.observability``: metrics, probes, worker presence, the logs, the invariant
checker, the per-workflow figures and the alert rules."""
