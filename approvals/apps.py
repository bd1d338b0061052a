from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"

    def ready(self) -> None:
        # The approvals app builds on the core and plugs into it; the core never imports it.
        from tasks_app import metrics as core_metrics
        from tasks_app import services as core

        from . import metrics, services, workflows  # noqa: F401  (the workflows register on import)

        core.register_sweep_job("expired_approvals", services.expire_due)
        core_metrics.register_part("approvals", metrics.approval_metrics)
