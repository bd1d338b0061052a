"""Telling approvers that a draft waits for them, by mail (Django's email framework).

Each notice is a task of its own on the durable core (workflow ``approvals.notify``),
enqueued in the transaction that opens, reminds or escalates a request, under the key
``approvals:notify:<request>:<kind>``: one notice of each kind per request (and so per
revision: a new revision is a new request). Its step sends one message per recipient
through the effects ledger (effect ``mail:<username>``): a retry sends only what was not
sent, and a message whose sending was cut short is never sent again on a guess; it waits
for on-call as ``outcome_unknown``.

Kinds:

- ``opened``: the request's approvers, when it opens (not the editor whose edit opened it);
- ``reminder``: before it expires, once, to those who have not approved it yet;
- ``escalated``: the second group, when nobody decided in time;
- ``digest`` (``APPROVALS_MAIL_DIGEST``): instead of ``opened``, one message per approver
  every ``APPROVALS_DIGEST_MINUTES`` listing the requests waiting for them.

Recipients are the people the request names (its groups' members and users) who may
decide it (:func:`services.decide_refusal`), have an address and are still concerned
(:func:`concerned`: not its draft's editor, not someone who approved it); with no list,
everyone given the decide permission. Superusers may decide anything but are told only when named.
A message links to the review; the link is plain, and the console asks for a login.
"""

from __future__ import annotations

import smtplib
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage
from django.db.models import Q
from django.dispatch import receiver
from django.urls import reverse
from django.utils import timezone
from django.utils.timesince import timeuntil

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.people import has_approved
from approvals.selectors import inbox
from approvals.services import DECIDE_PERMISSION, decide_refusal
from approvals.signals import request_opened
from tasks_app import services as core
from tasks_app.exceptions import EffectNotApplied, RemoteRefused
from tasks_app.workflows import StepContext

NOTIFY = "approvals.notify"
KINDS = ("opened", "reminder", "escalated", "digest")


# --- who, and when ------------------------------------------------------------------------


def concerned(request: ApprovalRequest, user: Any) -> bool:
    """Whether ``user`` is still to be told of ``request``: they may decide it (so neither
    enqueued its task nor wrote its draft) and have not approved it already. Asked when a
    notice is enqueued and again when it is sent."""
    return decide_refusal(request, user) is None and not has_approved(request, user)


def recipients(request: ApprovalRequest, kind: str) -> list[str]:
    """The usernames to tell of ``request`` (see the module's docstring), in name order."""
    users = get_user_model().objects
    if kind == "escalated":
        named = Q(groups__name=request.escalate_to)
    elif request.groups or request.approver_users:
        named = Q(groups__name__in=request.groups) | Q(username__in=request.approver_users)
    else:
        named = Q(
            pk__in=users.with_perm(
                DECIDE_PERMISSION,
                include_superusers=False,
                backend="django.contrib.auth.backends.ModelBackend",
            )
        )
    candidates = users.filter(named, is_active=True).exclude(email="").distinct()
    return [user.username for user in candidates.order_by("username") if concerned(request, user)]


@receiver(request_opened, dispatch_uid="approvals.notices.opened")
def notify_opened(sender: Any, *, request: ApprovalRequest, **kwargs: Any) -> None:
    """In the transaction that opens ``request``: its approvers' notice (unless digests
    replace it)."""
    if settings.APPROVALS_MAIL_DIGEST:
        return
    schedule(request, "opened")


def schedule(request: ApprovalRequest, kind: str) -> bool:
    """Enqueue ``request``'s notice of ``kind`` if anyone is to be told; True if so."""
    to = recipients(request, kind)
    if not to:
        return False
    core.enqueue(
        NOTIFY,
        {"kind": kind, "request": request.pk, "to": to},
        idempotency_key=f"approvals:notify:{request.pk}:{kind}",
        actor=core.SYSTEM,
    )
    return True


def schedule_digest(window: str, to: list[str]) -> None:
    core.enqueue(
        NOTIFY,
        {"kind": "digest", "window": window, "to": to},
        idempotency_key=f"approvals:digest:{window}",
        actor=core.SYSTEM,
    )


# --- the step that sends -------------------------------------------------------------------


def send_notice(ctx: StepContext) -> dict[str, Any]:
    """The ``approvals.notify`` step: one message to each recipient still concerned."""
    kind = ctx.payload["kind"]
    if kind == "digest":
        return _send_digest(ctx)
    request = (
        ApprovalRequest.objects.select_related("task").filter(pk=ctx.payload["request"]).first()
    )
    if request is None or request.status != ApprovalStatus.PENDING:
        # Decided (or gone) before its notice went out: nobody needs it any more.
        return {"sent": [], "skipped": "no longer waiting for a decision"}
    sent = []
    for user in _users(ctx.payload["to"]):
        # Asked again: the editor whose edit opened the request is named on it after its
        # notice was enqueued, and someone may have approved since.
        if not concerned(request, user):
            continue
        subject, body = compose(kind, request, user)
        _send_once(ctx, user, subject, body)
        sent.append(user.get_username())
    return {"sent": sent}


def _send_digest(ctx: StepContext) -> dict[str, Any]:
    sent = []
    for user in _users(ctx.payload["to"]):
        waiting = inbox(user).mine
        if not waiting:
            continue
        subject, body = compose_digest(waiting, user)
        _send_once(ctx, user, subject, body)
        sent.append(user.get_username())
    return {"sent": sent}


def _users(usernames: list[str]) -> list[Any]:
    found = get_user_model().objects.filter(username__in=usernames, is_active=True)
    return [user for user in found.order_by("username") if user.email]


def _send_once(ctx: StepContext, user: Any, subject: str, body: str) -> None:
    # A header is one line: a line break from a draft's title would make the message
    # impossible to build (no header is ever injected), so the subject's lines are joined.
    subject = " ".join(subject.splitlines())

    def deliver(key: str) -> dict[str, Any]:
        message = EmailMessage(
            subject,
            body,
            settings.DEFAULT_FROM_EMAIL,
            [user.email],
            headers={"X-Task-Console-Notice": key},
        )
        try:
            message.message()
        except ValueError as exc:
            # Built before anything is handed over (an address with a line break, say):
            # nothing was sent, and the same message would fail again, so the step is
            # dead-lettered for on-call as refused, never left with an unknown outcome.
            raise RemoteRefused(f"mail to {user.email!r} could not be built: {exc}") from exc
        try:
            message.send()
        except (
            ConnectionRefusedError,
            smtplib.SMTPConnectError,
            smtplib.SMTPHeloError,
            smtplib.SMTPAuthenticationError,
            smtplib.SMTPSenderRefused,
            smtplib.SMTPRecipientsRefused,
        ) as exc:
            # Refused before the message was handed over: nothing was sent, so a retry may
            # send it.
            raise EffectNotApplied(f"mail to {user.email} not sent: {exc}") from exc
        return {"to": user.email, "subject": subject}

    ctx.effects.run(f"mail:{user.get_username()}", deliver, idempotent_remote=False)


# --- what the messages say ----------------------------------------------------------------


def review_url(request: ApprovalRequest) -> str:
    return settings.CONSOLE_BASE_URL.rstrip("/") + reverse("console:review", args=[request.pk])


def _when(moment: Any) -> str:
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M %Z}"


def compose(kind: str, request: ApprovalRequest, user: Any) -> tuple[str, str]:
    """The subject and text of one notice of ``kind`` to ``user``."""
    left = timeuntil(request.expires_at)
    heads = {
        "opened": (
            f"Approval #{request.pk} waits for you: {request.summary}",
            "A draft waits for your decision.",
        ),
        "reminder": (
            f"Reminder: approval #{request.pk} expires in {left}",
            f"A draft still waits for your decision, and the request expires in {left}.",
        ),
        "escalated": (
            f"Escalated to {request.escalate_to}: approval #{request.pk}",
            f"Nobody decided on this draft in time, so it now waits for group "
            f"{request.escalate_to} too.",
        ),
    }
    subject, opening = heads[kind]
    votes = request.votes.count()
    lines = [
        f"Hello {user.get_username()},",
        "",
        opening,
        "",
        f"  On approval: {request.summary}",
        f"  Task: #{request.task_id} ({request.task.workflow}), revision {request.revision}",
        f"  Asked by: {request.requested_by or 'nobody named'}",
        *([f"  Draft edited by: {request.draft_author}"] if request.draft_author else []),
        *(
            [f"  Approvals: {votes} of {request.quorum}, each from a different person"]
            if request.quorum > 1
            else []
        ),
        f"  Expires: {_when(request.expires_at)} ({left} from now)",
        "",
        "Review it here (you will be asked to log in):",
        review_url(request),
    ]
    return subject[:200], "\n".join(lines) + "\n"


def compose_digest(waiting: list[ApprovalRequest], user: Any) -> tuple[str, str]:
    count = len(waiting)
    subject = f"{count} draft{'s' if count != 1 else ''} wait for your decision"
    lines = [f"Hello {user.get_username()},", "", f"{subject}:", ""]
    for request in waiting:
        lines += [
            f"- Approval #{request.pk}: {request.summary}",
            f"  expires {_when(request.expires_at)}: {review_url(request)}",
        ]
    lines += ["", "You will be asked to log in."]
    return subject, "\n".join(lines) + "\n"
