"""Who acts: the actor of every state change, and the permission checks the core and
approvals apply to users. String actors are trusted callers (commands, the sweeper) and
skip the checks; ``None`` is the system itself."""

from __future__ import annotations

from django.contrib.auth.models import AbstractUser, AnonymousUser

from tasks_app.exceptions import NotPermitted

# A user (the console, the admin), a name such as "cli:alice" or "system:sweeper", or None.
type Actor = AbstractUser | AnonymousUser | str | None

SYSTEM = "system"
SWEEPER = "system:sweeper"


def actor_fields(actor: Actor) -> tuple[str, int | None]:
    """The actor as events and rows store it: a name, and a user's id when it is one."""
    if actor is None:
        return SYSTEM, None
    if isinstance(actor, str):
        return actor.strip() or SYSTEM, None
    return actor.get_username(), actor.pk


def check_permission(actor: Actor, permission: str) -> None:
    """Users need ``tasks_app.<permission>``; string actors are trusted callers."""
    if actor is None or isinstance(actor, str):
        return
    if not actor.is_authenticated or not actor.has_perm(f"tasks_app.{permission}"):
        raise NotPermitted(f"{permission} is required")
