"""The approvals app's part of the demo seed (``tasks_app.demo.seeding``): the demo article
is drafted, sent back once by an editor, and redrafted, so an editor opening the console
finds revision 1 waiting, with the comment and what changed since revision 0."""

from __future__ import annotations

from approvals import services
from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app.engine import runner
from tasks_app.models import Task

# Not the enqueuer: nobody decides on a task they enqueued, trusted callers included.
EDITOR = "cli:demo-editor"
CHANGE_REQUEST = "Lead with a crash story, then show how the claim and the lease prevent it."


def revise_article(task: Task) -> int | None:
    """Draft, send back once as ``EDITOR``, redraft: revision 1 waits for an editor.
    Returns the revision of the request now waiting, if one is.

    Each stage runs only if the previous one is where the seed left it, so a second run
    does nothing and a decision made in the console stands.
    """
    requests = ApprovalRequest.objects.filter(task=task)
    if not requests.exists():
        runner.run_task_steps(task)
    if not requests.filter(status=ApprovalStatus.CHANGES_REQUESTED).exists():
        first = requests.filter(status=ApprovalStatus.PENDING, revision=0).first()
        if first is None:
            return None
        services.request_changes(first, actor=EDITOR, comment=CHANGE_REQUEST)
    if not requests.filter(revision__gte=1).exists():
        runner.run_task_steps(task)
    return requests.filter(status=ApprovalStatus.PENDING).values_list("revision", flat=True).first()
