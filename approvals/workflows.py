"""The shipped workflows with an editor in the loop (DESIGN §3).

``publish_article``: ``generate_draft`` -> ``editor_review`` (group editors, 48 h, then
dead-letters for on-call) -> ``publish`` (the remote honours idempotency keys, so a
timeout is retried with the same key) -> ``cleanup``.

``ticket_reply``: ``lookup_customer`` -> ``draft_reply`` -> ``review`` (group editors,
24 h, then cancels) -> ``send`` (the remote has no idempotency keys, so a timeout after
sending dead-letters as ``outcome_unknown`` for a person to resolve).

``press_release``: as ``publish_article``, but two editors must approve (``quorum=2``),
and after 8 hours undecided the senior editors may decide too (escalation).

``approvals.notify``: the approvers' mail (``approvals.notices``).

``demo.deliver``: one write to either remote through the effects ledger, with no person
in the loop; the fault drills (``make chaos``) count what reaches the remote.

The steps after a review send exactly the draft that was approved: they check its hash
against the one the approval recorded.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings

from approvals import notices, remote
from approvals.payloads import (
    check_article_draft,
    check_reply_draft,
    validate_article,
    validate_ticket,
)
from approvals.steps import approval_step, check_workflow, draft_hash
from tasks_app.demo.workflows import pause
from tasks_app.exceptions import InvalidInput, InvalidPayload, PermanentError, refuse_all
from tasks_app.workflows import StepContext, StepSpec, Workflow, register


def _approved(ctx: StepContext, draft_step: str, review_step: str) -> dict[str, Any]:
    """The draft, once checked to be the one the review approved."""
    draft: dict[str, Any] = ctx.results[draft_step]
    approval = ctx.results[review_step]
    if draft_hash(draft) != approval["draft_hash"]:
        raise PermanentError(f"the {draft_step} result is not the draft that was approved")
    return draft


def _revision_note(ctx: StepContext) -> str:
    change = ctx.change_request
    # No revision number in the draft's text: an editor's edit of it becomes the next
    # revision, and the pages print the revision the request holds.
    return f"\n\n(Revised as asked: {change['comment']})" if change else ""


# --- publish_article -------------------------------------------------------------------------


def generate_draft(ctx: StepContext) -> dict[str, Any]:
    payload = ctx.payload
    return {
        "article_id": payload["article_id"],
        "title": payload["title"],
        "body": f"{payload['title']}\n\n{payload['brief']}{_revision_note(ctx)}",
    }


def publish(ctx: StepContext) -> dict[str, Any]:
    return publish_approved(ctx, "editor_review")


def publish_approved(
    ctx: StepContext,
    review_step: str,
    draft_step: str = "generate_draft",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Publish the draft of ``draft_step`` that ``review_step`` approved (with ``extra``
    fields in the post), once (the remote honours keys)."""
    draft = _approved(ctx, draft_step, review_step)
    approval = ctx.results[review_step]
    answer = ctx.effects.run(
        "publish",
        lambda key: remote.post_json(
            settings.PUBLISH_URL,
            {
                "article_id": draft["article_id"],
                "title": draft["title"],
                "body": draft["body"],
                **(extra or {}),
                "approved_by": approval["approved_by"],
            },
            idempotency_key=key,
            honours_key=True,
            token=settings.PUBLISH_TOKEN,
        ),
        idempotent_remote=True,
    )
    return {"remote_id": answer.get("id"), "draft_hash": approval["draft_hash"]}


def cleanup(ctx: StepContext) -> dict[str, Any]:
    # Earlier revisions were working copies; the published one is kept by the remote. A
    # publish resolved by hand ("it happened") has no remote id, only the person's note.
    return {
        "article_id": ctx.payload["article_id"],
        "published_as": ctx.results["publish"].get("remote_id"),
        # The approved request's revision (an editor's edit is a revision too).
        "discarded_revisions": ctx.results["editor_review"]["revision"],
    }


PUBLISH_ARTICLE = register(
    check_workflow(
        Workflow(
            "publish_article",
            1,
            steps=(
                StepSpec("generate_draft", generate_draft),
                approval_step(
                    "editor_review",
                    draft_from="generate_draft",
                    action="publish",
                    summary=lambda ctx: (
                        f"Publishes article {ctx.payload['article_id']} "
                        f"“{ctx.payload['title']}” to {settings.PUBLISH_URL}"
                    ),
                    group="editors",
                    expires_after=timedelta(hours=48),
                    on_expiry="dead_letter",
                    editable=("title", "body"),
                    check_draft=check_article_draft,
                ),
                StepSpec("publish", publish, max_attempts=5, backoff_base=1.0, backoff_cap=60.0),
                StepSpec("cleanup", cleanup),
            ),
            validate_payload=validate_article,
            description="Draft an article, have an editor approve it, publish it once.",
        )
    )
)


# --- ticket_reply ----------------------------------------------------------------------------


def lookup_customer(ctx: StepContext) -> dict[str, Any]:
    # The customer directory of the demo: derived from the id, so every id resolves.
    customer_id = ctx.payload["customer_id"]
    return {
        "customer_id": customer_id,
        "name": customer_id.replace("-", " ").replace("_", " ").title(),
        "email": f"{customer_id}@customers.example",
    }


def draft_reply(ctx: StepContext) -> dict[str, Any]:
    customer = ctx.results["lookup_customer"]
    message = ctx.payload["message"]
    return {
        "to": customer["email"],
        "subject": f"Re: ticket {ctx.payload['ticket_id']}",
        "body": (
            f"Hello {customer['name']},\n\nThank you for writing to us about:\n> {message}\n\n"
            f"We are on it and will follow up shortly.{_revision_note(ctx)}"
        ),
    }


def send(ctx: StepContext) -> dict[str, Any]:
    draft = _approved(ctx, "draft_reply", "review")
    answer = ctx.effects.run(
        "send",
        lambda key: remote.post_json(
            settings.MAIL_URL,
            {"to": draft["to"], "subject": draft["subject"], "body": draft["body"]},
            idempotency_key=key,
            honours_key=False,
            token=settings.MAIL_TOKEN,
        ),
        idempotent_remote=False,
    )
    return {"message_id": answer.get("id"), "to": draft["to"]}


TICKET_REPLY = register(
    check_workflow(
        Workflow(
            "ticket_reply",
            1,
            steps=(
                StepSpec("lookup_customer", lookup_customer),
                StepSpec("draft_reply", draft_reply),
                approval_step(
                    "review",
                    draft_from="draft_reply",
                    action="send",
                    summary=lambda ctx: (
                        f"Sends a reply to {ctx.results['lookup_customer']['email']} "
                        f"on ticket {ctx.payload['ticket_id']}"
                    ),
                    group="editors",
                    expires_after=timedelta(hours=24),
                    on_expiry="cancel",
                    editable=("subject", "body"),
                    check_draft=check_reply_draft,
                ),
                # The mail remote cannot deduplicate: failures before sending are
                # retried, a timeout after sending waits for a person.
                StepSpec("send", send, max_attempts=3, backoff_base=1.0, backoff_cap=60.0),
            ),
            validate_payload=validate_ticket,
            description="Draft a reply to a support ticket, have an editor approve it, send it.",
        )
    )
)


# --- press_release ---------------------------------------------------------------------------


def publish_release(ctx: StepContext) -> dict[str, Any]:
    return publish_approved(ctx, "board_review")


PRESS_RELEASE = register(
    check_workflow(
        Workflow(
            "press_release",
            1,
            steps=(
                StepSpec("generate_draft", generate_draft),
                approval_step(
                    "board_review",
                    draft_from="generate_draft",
                    action="publish",
                    summary=lambda ctx: (
                        f"Publishes press release {ctx.payload['article_id']} "
                        f"“{ctx.payload['title']}” to {settings.PUBLISH_URL}"
                    ),
                    group="editors",
                    quorum=2,
                    escalate_to="senior_editors",
                    escalate_after=timedelta(hours=8),
                    remind_before=timedelta(hours=4),
                    expires_after=timedelta(hours=24),
                    on_expiry="dead_letter",
                    editable=("title", "body"),
                    check_draft=check_article_draft,
                ),
                StepSpec(
                    "publish", publish_release, max_attempts=5, backoff_base=1.0, backoff_cap=60.0
                ),
            ),
            validate_payload=validate_article,
            description=(
                "Draft a press release; two editors approve it (senior editors too after "
                "8 hours undecided); publish it once."
            ),
        )
    )
)


# --- approvals.notify ---------------------------------------------------------------------------


def validate_notice(payload: dict[str, Any]) -> None:
    errors: list[InvalidInput] = []
    if payload.get("kind") not in notices.KINDS:
        errors.append(
            InvalidPayload(
                "payload.kind", "choice", f"payload.kind: one of {', '.join(notices.KINDS)}"
            )
        )
    to = payload.get("to")
    if not isinstance(to, list) or not to or not all(isinstance(name, str) for name in to):
        errors.append(InvalidPayload("payload.to", "required", "payload.to: a list of usernames"))
    refuse_all(errors)


NOTIFY = register(
    Workflow(
        notices.NOTIFY,
        1,
        steps=(
            StepSpec(
                "send", notices.send_notice, max_attempts=5, backoff_base=5.0, backoff_cap=300.0
            ),
        ),
        validate_payload=validate_notice,
        description="Tells approvers by mail that a draft waits for them (once per request "
        "and kind).",
        # Enqueued when a request opens or nears its deadline, never by a person.
        internal=True,
    )
)


# --- demo.deliver ------------------------------------------------------------------------------

# Each remote, and whether it honours idempotency keys.
DELIVERY_REMOTES = {"publish": True, "mail": False}


def validate_delivery(payload: dict[str, Any]) -> None:
    errors: list[InvalidInput] = [
        InvalidPayload(f"payload.{name}", "known_field", f"payload.{name}: not a field")
        for name in sorted(set(payload) - {"remote", "sleep", "linger"})
    ]
    if payload.get("remote") not in DELIVERY_REMOTES:
        errors.append(
            InvalidPayload(
                "payload.remote",
                "choice",
                f"payload.remote: one of {', '.join(DELIVERY_REMOTES)}",
            )
        )
    for name in ("sleep", "linger"):
        value = payload.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 60:
            errors.append(
                InvalidPayload(
                    f"payload.{name}", "range", f"payload.{name}: a number of seconds from 0 to 60"
                )
            )
    refuse_all(errors)


def deliver(ctx: StepContext) -> dict[str, Any]:
    """Waits ``sleep`` seconds, writes to the remote, waits ``linger`` seconds (a crash
    then finds the write done and the step not)."""
    name = ctx.payload["remote"]
    honours_key = DELIVERY_REMOTES[name]
    url, token = (
        (settings.PUBLISH_URL, settings.PUBLISH_TOKEN)
        if name == "publish"
        else (settings.MAIL_URL, settings.MAIL_TOKEN)
    )
    pause(ctx, float(ctx.payload.get("sleep", 0)))
    answer = ctx.effects.run(
        "deliver",
        lambda key: remote.post_json(
            url,
            {"task": ctx.task_id},
            idempotency_key=key,
            honours_key=honours_key,
            token=token,
        ),
        idempotent_remote=honours_key,
    )
    pause(ctx, float(ctx.payload.get("linger", 0)))
    return {"remote_id": answer.get("id")}


DELIVER = register(
    Workflow(
        "demo.deliver",
        1,
        steps=(StepSpec("deliver", deliver, max_attempts=3, backoff_base=0.1, backoff_cap=1.0),),
        validate_payload=validate_delivery,
        description="Writes once to the publishing or mail remote, with no review.",
    )
)
