"""Who is who among the people deciding a request: whether two actors are one person
(the enqueuer and the draft's author may not decide; a person's approvals count once),
and whether one has approved a request already."""

from __future__ import annotations

import unicodedata

from approvals.models import ApprovalRequest
from tasks_app.models import Task
from tasks_app.services import Actor, actor_fields


def has_approved(request: ApprovalRequest, actor: Actor) -> bool:
    """Whether ``actor`` has approved ``request`` already (:func:`same_person`)."""
    reader = actor_fields(actor)
    votes = request.votes.values_list("voter", "voter_user_id")
    return any(same_person(reader, vote) for vote in votes)


def enqueued(task: Task, actor: Actor) -> bool:
    """Whether ``actor`` enqueued ``task`` (:func:`same_person`)."""
    return same_person(actor_fields(actor), (task.created_by, task.created_by_user_id))


def wrote_draft(request: ApprovalRequest, actor: Actor) -> bool:
    """Whether ``actor`` wrote the draft under review: an editor's own edit names its
    editor (the workflow's drafts are the producer's, refused as the enqueuer's)."""
    author = request.draft_author
    return bool(author) and same_person(actor_fields(actor), (author, None))


def same_person(one: tuple[str, int | None], other: tuple[str, int | None]) -> bool:
    """Whether two actors, each as its name and user id, are one person: the same user, or
    names that stand for the same person (:func:`person`). The enqueuer and the draft's
    author may not decide, and a person's approvals count once, by it."""
    if one[1] is not None and one[1] == other[1]:
        return True
    mine = person(one[0])
    return bool(mine) and mine == person(other[0])


def person(name: str) -> str:
    """The person an actor's name stands for, however it is spelled: a trusted caller's
    channel set aside (``"cli:alice"`` is alice), then compared without case and in
    Unicode's compatibility form (full-width ALICE, ``"Alice"`` and ``"alice"`` are one
    person). Two accounts whose names differ only so count as one person here: separating
    duties errs towards asking someone else."""
    bare = name.rsplit(":", 1)[-1].strip()
    folded = unicodedata.normalize("NFKC", bare).casefold()
    return unicodedata.normalize("NFKC", folded)
