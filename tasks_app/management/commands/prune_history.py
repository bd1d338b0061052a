"""``manage.py prune_history``: retention by hand (the sweeper prunes a batch each sweep)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.management.base import CommandParser

from tasks_app.management.cli import OperatorCommand, bad_input, positive_int
from tasks_app.operations import retention


def _counts(counts: Mapping[str, int]) -> str:
    """``claimed 3, enqueued 2``, by name; ``-`` for none."""
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items()) if n) or "-"


def _rows(counts: Mapping[str, int]) -> dict[str, int]:
    """Model labels as their plural names: ``tasks_app.Step`` -> ``steps``."""
    return {str(apps.get_model(label)._meta.verbose_name_plural): n for label, n in counts.items()}


class Command(OperatorCommand):
    help = (
        "Prune finished tasks (succeeded, cancelled) older than RETENTION_DAYS with their "
        "steps, leases, effects, approval requests and events, in batches of "
        "RETENTION_BATCH tasks, each its own transaction; operator events stay until "
        "AUDIT_RETENTION_DAYS. Dead, waiting, pending and running tasks are never pruned. "
        "The sweeper does the same a batch at a time; --dry-run counts what would go."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would go; delete nothing"
        )
        parser.add_argument(
            "--days",
            type=positive_int,
            help="prune tasks finished more than this many days ago (default RETENTION_DAYS)",
        )
        parser.add_argument(
            "--audit-days",
            type=positive_int,
            help="prune operator events recorded more than this many days ago, once their "
            "task is gone (default AUDIT_RETENTION_DAYS)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["days"] or settings.RETENTION_DAYS
        audit_days = options["audit_days"] or settings.AUDIT_RETENTION_DAYS
        if audit_days < days:
            raise bad_input(
                f"audit_days: must not be shorter than days ({audit_days} < {days}); "
                "operator events outlive their task"
            )
        cut = retention.cutoffs(days=days, audit_days=audit_days)
        if options["dry_run"]:
            report = retention.preview(cut)
            verb = "would prune (dry run, nothing changed)"
        else:
            report = retention.prune(cut)
            verb = "pruned"
        self.stdout.write(
            f"{verb}: {report.task_count} task(s) finished before "
            f"{cut.finished_before:%Y-%m-%d %H:%M:%S %Z} ({_counts(report.tasks)})"
        )
        self.stdout.write(f"  with them: {_counts(_rows(report.rows))}")
        self.stdout.write(
            f"  their events: {sum(report.events.values())} ({_counts(report.events)})"
        )
        self.stdout.write(f"  their operator events kept for audit: {report.kept_for_audit}")
        self.stdout.write(
            f"operator events recorded before {cut.audit_before:%Y-%m-%d %H:%M:%S %Z}, "
            f"their task gone: {sum(report.audit_events.values())} "
            f"({_counts(report.audit_events)})"
        )
