"""A four-step workflow whose third step sends mail through a remote that does not honour
keys, for the rewind's tests and its page: ``fetch`` -> ``draft`` -> ``mail`` -> ``archive``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tasks_app import services
from tasks_app.exceptions import RemoteRefused
from tasks_app.models import Task
from tasks_app.workflows import StepContext, StepSpec, Workflow
from tests.graph_support import run

NAME = "test.rewind.newsletter"


@dataclass
class Mailer:
    """A mail service outside the product: every call sends. ``lose_answer`` makes the next
    call send and then time out (the answer lost), as a mail server that hangs up does;
    ``refuse`` makes the next call refused before anything is sent."""

    sent: list[str] = field(default_factory=list)
    lose_answer: bool = False
    refuse: bool = False
    drafts: list[str] = field(default_factory=list)

    def send(self, key: str, subject: str) -> dict[str, Any]:
        if self.refuse:
            self.refuse = False
            raise RemoteRefused("the mail server refused the list address")
        self.sent.append(subject)
        if self.lose_answer:
            self.lose_answer = False
            raise TimeoutError("the mail server hung up after the message was sent")
        return {"message_id": f"m-{len(self.sent)}"}


def newsletter(mailer: Mailer) -> Workflow:
    def fetch(ctx: StepContext) -> dict[str, Any]:
        return {"subscribers": 3}

    def draft(ctx: StepContext) -> dict[str, Any]:
        subject = f"News: {ctx.payload['topic']}"
        mailer.drafts.append(subject)
        return {"subject": subject}

    def mail(ctx: StepContext) -> dict[str, Any]:
        subject = ctx.results["draft"]["subject"]
        return ctx.effects.run(
            "mail", lambda key: mailer.send(key, subject), idempotent_remote=False
        )

    def archive(ctx: StepContext) -> dict[str, Any]:
        return {"archived": ctx.results["mail"]}

    return Workflow(
        NAME,
        1,
        steps=(
            StepSpec("fetch", fetch),
            StepSpec("draft", draft),
            StepSpec("mail", mail, max_attempts=1),
            StepSpec("archive", archive),
        ),
    )


def sent_task(
    mailer: Mailer, *, topic: str = "spring", lose_answer: bool = False, refuse: bool = False
) -> Task:
    """A newsletter task run as far as it goes: to the end, or dead at ``mail`` with its
    message sent and its outcome unknown (``lose_answer``) or refused, nothing sent and no
    write in doubt (``refuse``)."""
    task = services.enqueue(NAME, {"topic": topic}).task
    mailer.lose_answer = lose_answer
    mailer.refuse = refuse
    for kind in ("fetch", "draft", "mail"):
        run(task, kind)
    if not (lose_answer or refuse):
        run(task, "archive")
    task.refresh_from_db()
    return task
