"""The Tokens page (``/tokens/``): the API tokens of the person reading (and everyone
else's, with their owners, for a superuser), a form that makes one, and on each live one
a revoke with a reason.

A token acts as its owner, cut to its group's permissions (``tasks_app.operations.tokens``).
Its secret is shown once: in the answer to the POST that made it, which is rendered, not
redirected to (a page reached by a redirect would have to carry the secret, or lose it),
and like every answer here sent ``Cache-Control: no-store``
(``console.middleware.NoStoreMiddleware``). Only the secret's digest is kept, so no later
page can show it again.

A token is looked up only among those its reader may see: another's token is 404 to anyone
but a superuser, and shows nothing of itself. The service checks the owner again, records
the events and refuses bad input naming the field, which the form shows on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from console import errors
from console.token_forms import RevokeForm, TokenForm
from console.views import ConsoleRequest, render_page
from tasks_app.db.clock import db_now
from tasks_app.exceptions import NotPermitted
from tasks_app.models import ApiToken, AutoApply
from tasks_app.operations import tokens
from tasks_app.operations.tokens import IssuedToken

TEMPLATE = "console/tokens.html"

# Each state's badge (the classes of the task statuses that read alike).
BADGES = {"live": "status-succeeded", "expired": "status-cancelled", "revoked": "status-dead"}


@dataclass(frozen=True)
class TokenRow:
    token: ApiToken
    # live, expired or revoked
    state: str
    # A live token's revoke form (bound, with its errors, after a refused revoke).
    form: RevokeForm | None = None

    @property
    def badge(self) -> str:
        return BADGES[self.state]


def _person(request: ConsoleRequest) -> User:
    user = request.user
    # LoginRequiredMiddleware: only a signed-in person reaches these views.
    assert isinstance(user, User)
    return user


def _rows(found: list[ApiToken], now: datetime, revoking: RevokeForm | None) -> list[TokenRow]:
    rows = []
    for token in found:
        if token.revoked_at is not None:
            rows.append(TokenRow(token, "revoked"))
        elif token.expires_at <= now:
            rows.append(TokenRow(token, "expired"))
        else:
            mine = revoking is not None and revoking.token_id == token.pk
            rows.append(TokenRow(token, "live", form=revoking if mine else RevokeForm(token.pk)))
    return rows


def _page(
    request: ConsoleRequest,
    *,
    form: TokenForm | None = None,
    issued: IssuedToken | None = None,
    revoking: RevokeForm | None = None,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    """The page; for htmx its tokens region. ``issued`` is a token just made, whose secret
    this one answer shows."""
    user = _person(request)
    rows = _rows(list(tokens.visible(user)), db_now(), revoking)
    context: dict[str, Any] = {
        "mine": [row for row in rows if row.token.user_id == user.pk],
        "others": [row for row in rows if row.token.user_id != user.pk],
        # A superuser's page lists everyone else's tokens too.
        "everyone": user.is_superuser,
        "form": form or TokenForm(user),
        "issued": issued,
        "curl": _curl(issued) if issued else "",
        "error": error,
        "api_docs": reverse("api:openapi-view"),
    }
    return render_page(request, TEMPLATE, context, partial="tokens", status=status)


def _curl(issued: IssuedToken) -> str:
    """A first call with the new token, ready to paste: the tasks it may read."""
    url = settings.CONSOLE_BASE_URL.rstrip("/") + reverse("api:task_list")
    return f'curl -H "Authorization: Bearer {issued.secret}" {url}'


@require_GET
def token_list(request: ConsoleRequest) -> HttpResponse:
    return _page(request)


@require_POST
def token_create(request: ConsoleRequest) -> HttpResponse:
    """Make a token of the reader's and answer with its secret, once (a render, never a
    redirect); bad input answers 400 with the form, the error on the field it names."""
    user = _person(request)
    form = TokenForm(user, request.POST)
    if not form.is_valid():
        return _page(request, form=form, status=400)
    data = form.cleaned_data
    try:
        issued = tokens.issue(
            user,
            name=data["name"],
            group=data["group"],
            days=data["days"],
            # A form without the choice gets the service's own default.
            auto_apply=data["auto_apply"] or AutoApply.NEVER,
            actor=user,
        )
    except NotPermitted as exc:
        raise PermissionDenied(str(exc)) from exc
    except errors.REFUSED as exc:
        refused = errors.refusal(request, exc, form)
        return _page(request, form=form, error=refused.message, status=refused.status)
    return _page(request, issued=issued)


@require_POST
def token_revoke(request: ConsoleRequest, pk: int) -> HttpResponse:
    """Revoke a token the reader may see (404 for any other), with a reason."""
    user = _person(request)
    token = get_object_or_404(tokens.visible(user), pk=pk)
    form = RevokeForm(token.pk, request.POST)
    if not form.is_valid():
        return _page(request, revoking=form, status=400)
    try:
        tokens.revoke(token, actor=user, reason=form.cleaned_data["reason"])
    except NotPermitted as exc:
        raise PermissionDenied(str(exc)) from exc
    except errors.REFUSED as exc:
        refused = errors.refusal(request, exc, form)
        return _page(request, revoking=form, error=refused.message, status=refused.status)
    messages.success(
        request,
        f"Token {token.name} (tc_{token.prefix}_…) of {token.user} revoked: "
        "a call with it is refused from now on.",
    )
    if request.htmx:
        return _page(request)
    return redirect("console:tokens")
