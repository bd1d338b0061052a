"""``tasks_app.operations``: operator actions, the reads behind the pages, retention, the
audit chain and redaction."""
