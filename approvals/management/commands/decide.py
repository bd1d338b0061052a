"""``manage.py decide``: list approval requests, or decide one as a named user."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError

from approvals import selectors, services
from approvals.models import ApprovalRequest
from tasks_app.exceptions import InvalidInput, InvalidTransition

DECISIONS = {
    "approve": services.approve,
    "reject": services.reject,
    "request-changes": services.request_changes,
}


class Command(BaseCommand):
    help = (
        "List pending approval requests, or decide one as a user (with that user's "
        "permissions and approver checks) and print the request as JSON."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("decision", nargs="?", choices=[*DECISIONS, "list"], default="list")
        parser.add_argument("request", nargs="?", type=int, help="the approval request's id")
        parser.add_argument("--user", help="the username deciding")
        parser.add_argument("--comment", default="")
        parser.add_argument(
            "--draft-hash", default=None, help="the hash of the draft you reviewed (checked)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user = self._user(options["user"]) if options["user"] else None
        if options["decision"] == "list":
            # With --user, only what that user may decide.
            listed = selectors.decidable_by(user) if user else selectors.pending_requests()
            for request in listed:
                self.stdout.write(json.dumps(_row(request), ensure_ascii=False))
            return
        if options["request"] is None or user is None:
            raise CommandError("deciding needs a request id and --user")
        found = ApprovalRequest.objects.filter(pk=options["request"]).first()
        if found is None:
            raise CommandError(f"request: no approval request #{options['request']}")
        try:
            decided = DECISIONS[options["decision"]](
                found,
                actor=user,
                comment=options["comment"],
                draft_hash=options["draft_hash"],
            )
        except (InvalidInput, InvalidTransition, PermissionDenied) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(json.dumps(_row(decided), ensure_ascii=False))

    def _user(self, username: str) -> Any:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"user: no user named {username!r}")
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
