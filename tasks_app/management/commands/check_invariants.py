"""``manage.py check_invariants``: stored state checked against its event history and the
clock."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from tasks_app.management.cli import OperatorCommand, bad_input, parse_duration
from tasks_app.observability import invariants

FOUND = 1


def _since(text: str) -> datetime | timedelta:
    """A duration back from now (``24h``, ``7d``) or an ISO 8601 time with a time zone."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        try:
            return parse_duration(text, "since")
        except CommandError:
            raise bad_input(
                "since: a duration back from now (24h, 7d) or an ISO 8601 time with a time zone"
            ) from None
    if timezone.is_naive(moment):
        raise bad_input("since: a time needs a time zone (e.g. 2030-01-01T00:00:00+00:00)")
    return moment


class Command(OperatorCommand):
    help = (
        "Check that stored state agrees with its event history and the clock: tasks whose "
        "steps differ from their folded events (history), steps running past their lease "
        "(lease), dead steps without their dead_lettered event (dead_letter), effects nobody "
        "will decide (effect), approvals past their expiry (approval), histories that do not "
        "start with enqueued (enqueued), fencing tokens that do not rise or exceed the "
        "step's (fencing), claims with no outcome while the step no longer runs on them "
        "(claim), runs ended twice without a redrive or resolve between (terminal), "
        "payloads, results or change requests Python cannot decode (undecodable). One "
        "line per finding; exit status 1 if there is any, else 0. By default it checks the "
        "active tasks and those created or finished in the last 24 h."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        scope = parser.add_mutually_exclusive_group()
        scope.add_argument(
            "--since",
            metavar="WHEN",
            help="also fold tasks created or finished since then: a duration back from now "
            "(24h, 7d) or an ISO 8601 time (default 24h)",
        )
        scope.add_argument("--all", action="store_true", help="fold every task")

    def handle(self, *args: Any, **options: Any) -> None:
        since: datetime | timedelta | None = None if options["all"] else invariants.DEFAULT_WINDOW
        if options["since"] is not None:
            since = _since(options["since"])
        report = invariants.check(since=since)
        for finding in report.findings:
            self.stdout.write(str(finding))
        scope = "all tasks" if report.since is None else f"since {report.since.isoformat()}"
        summary = f"{report.tasks_checked} task(s) folded ({scope})"
        if not report.ok:
            raise CommandError(f"{len(report.findings)} finding(s); {summary}", returncode=FOUND)
        self.stdout.write(f"ok: no findings; {summary}")
