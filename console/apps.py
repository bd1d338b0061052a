"""The console app: the on-call, editors' and auditors' pages."""

from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Console"

    def ready(self) -> None:
        # The logins' figures on /metrics (the per-username ceiling).
        from console import logins
        from tasks_app.observability import metrics

        metrics.register_part("logins", logins.login_metrics)
