"""``manage.py decide``: list approval requests, or decide one as a named user; as aligned
lines for a person, or as JSON Lines (``--json``: one object per request, one per line)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandParser

from approvals import selectors, services
from approvals.models import ApprovalRequest
from tasks_app.management.cli import OperatorCommand, bad_input, task_id
from tasks_app.management.output import line, table, when

DECISIONS = {
    "approve": services.approve,
    "reject": services.reject,
    "request-changes": services.request_changes,
}
# How much of a request's summary a line shows (--json has all of it).
MAX_SUMMARY = 120


class Command(OperatorCommand):
    help = (
        "List pending approval requests, or decide one as a user (with that user's "
        "permissions and approver checks) and print the request; as aligned lines, or with "
        "--json as JSON Lines (one JSON object per request, one per line)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("decision", nargs="?", choices=[*DECISIONS, "list"], default="list")
        parser.add_argument(
            "request", nargs="?", type=task_id, metavar="ID", help="the approval request's id"
        )
        parser.add_argument(
            "--user", help="the username deciding (with list: what they may decide)"
        )
        parser.add_argument("--comment", default="")
        parser.add_argument(
            "--draft-hash", default=None, help="the hash of the draft you reviewed (checked)"
        )
        parser.add_argument(
            "--json", action="store_true", help="print JSON Lines: one object per request"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user = self._user(options["user"]) if options["user"] else None
        if options["decision"] == "list":
            # With --user, only what that user may decide.
            listed = selectors.decidable_by(user) if user else list(selectors.pending_requests())
            self._print(listed, options["json"], empty="No pending approval requests.")
            return
        if options["request"] is None or user is None:
            raise bad_input("request: deciding needs a request id and --user")
        found = ApprovalRequest.objects.filter(pk=options["request"]).first()
        if found is None:
            raise bad_input(f"request: no approval request #{options['request']}")
        decided = DECISIONS[options["decision"]](
            found,
            actor=user,
            comment=options["comment"],
            draft_hash=options["draft_hash"],
        )
        self._print([decided], options["json"], empty="")

    def _print(self, requests: list[ApprovalRequest], as_json: bool, *, empty: str) -> None:
        if as_json:
            for request in requests:
                self.stdout.write(json.dumps(_row(request), ensure_ascii=False))
            return
        if not requests:
            self.stdout.write(empty)
            return
        rows = [
            (
                str(request.pk),
                str(request.task_id),
                request.task.workflow,
                str(request.revision),
                request.status,
                f"{request.votes.count()} of {request.quorum}",
                when(request.expires_at),
                line(request.decided_by),
                line(request.summary, limit=MAX_SUMMARY),
            )
            for request in requests
        ]
        header = (
            "id", "task", "workflow", "rev", "status", "approvals", "expires", "decided by",
            "summary",
        )  # fmt: skip
        for text in table(header, rows, right=1):
            self.stdout.write(text)

    def _user(self, username: str) -> Any:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise bad_input(f"user: no user named {username!r}")
        return user


def _row(request: ApprovalRequest) -> dict[str, Any]:
    return {
        "id": request.pk,
        "task": request.task_id,
        "workflow": request.task.workflow,
        "revision": request.revision,
        "status": request.status,
        # With a quorum, a request stays pending until enough people approved it.
        "approvals": request.votes.count(),
        "quorum": request.quorum,
        "action": request.action,
        "summary": request.summary,
        "draft_hash": request.draft_hash,
        "expires_at": request.expires_at.isoformat(),
        "decided_by": request.decided_by,
    }
