"""Who is who among the people deciding a request: whether two actors are one person
(the enqueuer may not decide; a person's approvals count once), and whether one has
approved a request already."""

from __future__ import annotations

from approvals.models import ApprovalRequest
from tasks_app.services import Actor, actor_fields


def has_approved(request: ApprovalRequest, actor: Actor) -> bool:
    """Whether ``actor`` has approved ``request`` already (:func:`same_person`)."""
    reader = actor_fields(actor)
    votes = request.votes.values_list("voter", "voter_user_id")
    return any(same_person(reader, vote) for vote in votes)


def same_person(one: tuple[str, int | None], other: tuple[str, int | None]) -> bool:
    """Whether two actors, each as its name and user id, are one person: the same user, or
    the same name once a trusted caller's channel is set aside (``"cli:alice"`` is alice,
    both ways). The enqueuer may not decide, and a person's approvals count once, by it."""
    if one[1] is not None and one[1] == other[1]:
        return True
    return _bare(one[0]) == _bare(other[0])


def _bare(name: str) -> str:
    return name.rsplit(":", 1)[-1]
