"""``tasks_app.integrations`` and ``tasks_app.backends``: the admin, ``django.tasks``,
Celery's broker transport, the management commands."""
