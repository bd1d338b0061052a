"""The approvals app: plugs its sweep jobs, metrics and demo scenario into the core when
Django starts."""

from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"

    def ready(self) -> None:
        # The approvals app builds on the core and plugs into it (sweep jobs, metrics); the
        # core's modules never import it (the demo's seed command asks for its scenario by name).
        from approvals import (  # noqa: F401  (the workflows register on import)
            deadlines,
            demo,
            metrics,
            notices,
            release_notes,
            services,
            workflows,
        )
        from tasks_app import services as core
        from tasks_app.demo import seeding
        from tasks_app.observability import metrics as core_metrics

        core.register_sweep_job("expired_approvals", deadlines.expire_due)
        core.register_sweep_job("escalated_approvals", deadlines.escalate_due)
        core.register_sweep_job("approval_reminders", deadlines.remind_due)
        core.register_sweep_job("approval_digests", deadlines.digest_due)
        core_metrics.register_part("approvals", metrics.approval_metrics)
        seeding.register_scenario(seeding.REVISED_ARTICLE, demo.revise_article)
