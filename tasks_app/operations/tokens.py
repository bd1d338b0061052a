"""Each person's API tokens: made and revoked by their owner (or a superuser), each an
event in the audit chain; found from the secret a program sends; and the actor a token's
calls act as: its user, with no permission beyond those of the token's group.

A token reads ``tc_<prefix>_<secret>``. The prefix finds the row (lists and logs show
it); the secret is compared by its SHA-256 in constant time. A token whose user is
inactive, that expired or was revoked finds nothing.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractUser, Group, User
from django.db import IntegrityError, transaction
from django.db.models import F, QuerySet

from tasks_app import validation
from tasks_app.access import Actor, actor_fields
from tasks_app.db.clock import db_now
from tasks_app.exceptions import InvalidInput, InvalidTransition, NotPermitted
from tasks_app.history.events import record_event
from tasks_app.models import ApiToken, AutoApply, EventKind

SCHEME = "tc"
NAME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    # The whole token, shown once: only its digest is kept.
    secret: str


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def visible(user: User) -> QuerySet[ApiToken]:
    """The tokens ``user`` may see and revoke: their own; everyone's, for a superuser (as
    :func:`revoke` allows). Live ones first, then the most recently revoked; newest first
    within each."""
    found = ApiToken.objects.select_related("user", "group").order_by(
        F("revoked_at").desc(nulls_first=True), "-id"
    )
    return found if user.is_superuser else found.filter(user=user)


def offered_groups(user: User) -> QuerySet[Group]:
    """The groups a token of ``user`` may take its permissions from: their own (every
    group, for a superuser, whose token is still cut to the group)."""
    if user.is_superuser:
        return Group.objects.order_by("name")
    return user.groups.order_by("name")


def issue(
    user: User,
    *,
    name: Any,
    group: Any,
    days: Any,
    auto_apply: Any = AutoApply.NEVER,
    actor: Actor = None,
) -> IssuedToken:
    """A new token for ``user``, valid for ``days`` (1 to ``API_TOKEN_MAX_DAYS``), with
    the permissions of ``group`` (a name) that ``user`` has. ``actor`` is who makes it:
    ``user`` themselves, a superuser, or a trusted caller."""
    _check_owner(actor, user, "make")
    name = validation.require_text(name, "name")
    if len(name) > 64 or not set(name) <= NAME_CHARACTERS:
        raise InvalidInput(
            "name", "format", "name: up to 64 of a-z, 0-9, '-', '_' and '.' (the program's name)"
        )
    chosen = offered_groups(user).filter(name=group).first()
    if chosen is None:
        raise InvalidInput("group", "choice", "group: one of the groups the token's user is in")
    if auto_apply not in AutoApply.values:
        raise InvalidInput("auto_apply", "choice", f"auto_apply: one of {', '.join(AutoApply)}")
    valid_days = _days(days)
    prefix = secrets.token_hex(4)
    secret = f"{SCHEME}_{prefix}_{secrets.token_urlsafe(32)}"
    taken = InvalidInput("name", "unique", f"name: {user} has a live token named {name}")
    try:
        with transaction.atomic():
            if ApiToken.objects.filter(user=user, name=name, revoked_at=None).exists():
                raise taken
            token = _create(user, name, prefix, secret, chosen, auto_apply, valid_days, actor)
    except IntegrityError:
        # The same name made at the same moment: the constraint decided.
        raise taken from None
    return IssuedToken(token, secret)


def _create(
    user: User,
    name: str,
    prefix: str,
    secret: str,
    group: Group,
    auto_apply: str,
    days: int,
    actor: Actor,
) -> ApiToken:
    """The token's row and its ``token_created`` event, in the caller's transaction."""
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=prefix,
        digest=digest(secret),
        group=group,
        auto_apply=auto_apply,
        expires_at=db_now() + timedelta(days=days),
    )
    record_event(
        EventKind.TOKEN_CREATED,
        task_id=None,
        actor=actor or user,
        reason=f"token {name} for {user}",
        program=_described(token),
    )
    return token


def revoke(token: ApiToken, *, actor: Actor, reason: Any) -> ApiToken:
    """End ``token`` now; a call with it afterwards is refused (401)."""
    _check_owner(actor, token.user, "revoke")
    reason = validation.require_text(reason, "reason")
    with transaction.atomic():
        locked = ApiToken.objects.select_for_update().get(pk=token.pk)
        if locked.revoked_at is not None:
            raise InvalidTransition(f"token {locked.name} is revoked already")
        locked.revoked_at = db_now()
        locked.revoked_by = actor_fields(actor)[0]
        locked.save(update_fields=["revoked_at", "revoked_by"])
        record_event(
            EventKind.TOKEN_REVOKED,
            task_id=None,
            actor=actor,
            reason=reason,
            program=_described(locked),
        )
    return locked


def _days(days: Any) -> int:
    most: int = settings.API_TOKEN_MAX_DAYS
    try:
        value = int(days)
    except (TypeError, ValueError):
        value = 0
    if not 1 <= value <= most or isinstance(days, bool):
        raise InvalidInput("days", "range", f"days: a whole number from 1 to {most}")
    return value


def _check_owner(actor: Actor, user: User, verb: str) -> None:
    """A person makes and revokes their own tokens; a superuser anyone's; a trusted
    caller (a command) too."""
    if actor is None or isinstance(actor, str):
        return
    if not actor.is_authenticated or (actor.pk != user.pk and not actor.is_superuser):
        raise NotPermitted(f"only its owner or a superuser may {verb} a token of {user}")
    if getattr(actor, "api_token", None) is not None:
        raise NotPermitted(f"a token cannot {verb} tokens: sign in to the console")


def _described(token: ApiToken) -> dict[str, Any]:
    """What a token's events record of it, under ``program`` (the redaction hides the value
    of any key named like ``token``)."""
    return {
        "id": token.pk,
        "name": token.name,
        "prefix": token.prefix,
        "user": token.user.get_username(),
        "group": token.group.name,
        "auto_apply": token.auto_apply,
        "expires_at": token.expires_at.isoformat(),
    }


# --- use -----------------------------------------------------------------------------------


def find(secret: str) -> ApiToken | None:
    """The live token ``secret`` is, or None."""
    scheme, _, rest = secret.partition("_")
    prefix, _, _ = rest.partition("_")
    if scheme != SCHEME or not prefix:
        return None
    token = (
        ApiToken.objects.select_related("user", "group")
        .filter(prefix=prefix, revoked_at=None, expires_at__gt=db_now(), user__is_active=True)
        .first()
    )
    if token is None or not hmac.compare_digest(token.digest, digest(secret)):
        return None
    return token


def record_use(token: ApiToken, address: str | None) -> None:
    """When and from where the token was last used: one UPDATE, outside any transaction
    the call makes (a refused call was a use too)."""
    now = db_now()
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=now, last_used_address=address)
    token.last_used_at, token.last_used_address = now, address


def permissions(token: ApiToken) -> frozenset[str]:
    """What the token may do: its group's permissions (``app_label.codename``)."""
    return frozenset(
        f"{app}.{codename}"
        for app, codename in token.group.permissions.values_list(
            "content_type__app_label", "codename"
        )
    )


def acting_user(token: ApiToken) -> AbstractUser:
    """The actor a token's calls act as: a copy of its user, named for events as
    ``<user> via <token name>``, that has a permission only if the user has it and the
    token's group gives it (superusers included). Rows it is written to (a task's
    ``created_by_user``) still reference the user."""
    user = token.user
    allowed = permissions(token)
    acting = copy.copy(user)
    name = f"{user.get_username()} via {token.name}"

    def has_perm(perm: str, obj: Any = None) -> bool:
        return perm in allowed and user.has_perm(perm, obj)

    # Instance attributes: the copy answers for the token, the user stays as they are.
    acting.has_perm = has_perm  # type: ignore[method-assign]
    acting.get_username = lambda: name  # type: ignore[method-assign]
    acting.api_token = token  # type: ignore[attr-defined]
    return acting


def token_of(actor: Actor) -> ApiToken | None:
    """The token an actor acts through, if it is a token's actor."""
    token = getattr(actor, "api_token", None)
    return token if isinstance(token, ApiToken) else None
