"""The Tokens page: each person's API tokens (everyone's, with the owners, for a superuser);
a token made with a name, a group's permissions, days and what it may apply itself, its
secret shown in that one answer and only its digest stored; a live token revoked with a
reason. Bad input answers 400 on the field it names and stores nothing; another's token is
404 to all but a superuser; every change is an event naming who made it."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http.response import HttpResponseBase
from django.test import Client

from tasks_app.db.clock import db_now
from tasks_app.exceptions import NotPermitted
from tasks_app.models import ApiToken, AutoApply, Event, EventKind
from tasks_app.operations import tokens
from tests.console_support import HTMX, body, login

pytestmark = pytest.mark.django_db

SECRET = re.compile(r"tc_[0-9a-f]{8}_[A-Za-z0-9_-]{20,}")


def made(user: User, name: str = "triage-bot", group: str = "oncall") -> ApiToken:
    return tokens.issue(user, name=name, group=group, days=30, actor=user).token


def make(client: Client, headers: dict[str, str] | None = None, **fields: str) -> HttpResponseBase:
    data = {"name": "triage-bot", "group": "oncall", "days": "30", "auto_apply": "never"}
    return client.post("/tokens/new/", {**data, **fields}, headers=headers or {})


def revoke(
    client: Client, token: ApiToken, reason: str = "rotated", headers: dict[str, str] | None = None
) -> HttpResponseBase:
    return client.post(f"/tokens/{token.pk}/revoke/", {"reason": reason}, headers=headers or {})


def row(page: str, token: ApiToken) -> str:
    start = page.index(f'<tr id="token-{token.pk}"')
    return page[start : page.index("</tr>", start)]


def secrets_in(page: str) -> list[str]:
    return SECRET.findall(page)


def token_events(kind: str) -> list[Event]:
    return list(Event.objects.filter(kind=kind).order_by("pk"))


def no_store(response: HttpResponseBase) -> bool:
    return "no-store" in {part.strip() for part in response.get("Cache-Control", "").split(",")}


# --- reading ---------------------------------------------------------------------------------


def test_a_person_sees_their_own_tokens_and_nobody_elses(oncall: User, auditor: User) -> None:
    mine = made(oncall)
    theirs = made(auditor, name="audit-export", group="auditors")
    tokens.record_use(mine, "203.0.113.7")

    response = login(oncall).get("/tokens/")

    page = body(response)
    assert response.status_code == 200
    assert "<h1>Tokens</h1>" in page
    assert "as you, cut to the permissions of the group you choose" in page
    assert "you or a colleague sign them in the console" in page
    shown = row(page, mine)
    assert "triage-bot" in shown
    assert f'<code class="mono muted token-id">tc_{mine.prefix}_…</code>' in shown
    assert "<td>oncall</td>" in shown
    assert "<td>None: every plan waits for a person</td>" in shown
    assert 'from <span class="mono">203.0.113.7</span>' in shown
    assert '<span class="badge status-succeeded">live</span>' in shown
    assert f'action="/tokens/{mine.pk}/revoke/"' in shown
    # Nothing of another's token, and no owner column.
    assert "audit-export" not in page and theirs.prefix not in page
    assert "Everyone else" not in page and ">Owner<" not in page
    # No secret on a page read by GET.
    assert secrets_in(page) == []


def test_the_nav_offers_tokens_to_everyone_signed_in_marked_on_its_page(outsider: User) -> None:
    page = body(login(outsider).get("/tokens/"))
    nav = page[page.index('<nav aria-label="Sections">') : page.index("</nav>")]
    assert 'href="/tokens/" aria-current="page">Tokens<' in nav


def test_the_nav_links_to_tokens_from_other_pages_without_marking_it(oncall: User) -> None:
    page = body(login(oncall).get("/queues/"))
    nav = page[page.index('<nav aria-label="Sections">') : page.index("</nav>")]
    assert '<a href="/tokens/" >Tokens</a>' in nav


def test_an_anonymous_visitor_is_sent_to_the_login(client: Client) -> None:
    response = client.get("/tokens/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=/tokens/")


def test_a_person_in_no_group_is_told_why_no_token_can_be_made(outsider: User) -> None:
    page = body(login(outsider).get("/tokens/"))
    assert "You are in no group, so a token of yours could do nothing" in page
    assert 'action="/tokens/new/"' not in page
    assert "You have no token yet." in page


def test_the_form_offers_the_persons_groups_90_days_and_no_auto_apply(
    oncall: User, settings: Any
) -> None:
    page = body(login(oncall).get("/tokens/"))
    group = page[page.index('name="group"') : page.index("</select>", page.index('name="group"'))]
    assert re.findall(r'<option value="([^"]+)"', group) == ["oncall"]
    assert re.search(r'<input type="number" name="days" value="90"[^>]* max="365"', page)
    assert '<option value="never" selected>None: every plan waits for a person</option>' in page

    settings.API_TOKEN_MAX_DAYS = 30
    page = body(login(oncall).get("/tokens/"))
    assert re.search(r'<input type="number" name="days" value="30"[^>]* max="30"', page)
    assert "From 1 to 30." in page


def test_expired_and_revoked_tokens_are_marked_and_offer_no_revoke(
    oncall: User, superuser: User
) -> None:
    expired = made(oncall, name="old-bot")
    ApiToken.objects.filter(pk=expired.pk).update(expires_at=db_now() - timedelta(days=1))
    revoked = made(oncall, name="gone-bot")
    tokens.revoke(revoked, actor=superuser, reason="left the team")
    live = made(oncall)

    page = body(login(oncall).get("/tokens/"))

    assert '<span class="badge status-cancelled">expired</span>' in row(page, expired)
    assert "<form" not in row(page, expired)
    gone = row(page, revoked)
    assert '<span class="badge status-dead">revoked</span>' in gone
    assert f"by {superuser.username}, <time" in gone
    assert "<form" not in gone
    # Live ones first, then the revoked.
    assert page.index(f'id="token-{live.pk}"') < page.index(f'id="token-{revoked.pk}"')


def test_a_superuser_sees_everyones_tokens_with_their_owners(
    oncall: User, auditor: User, superuser: User
) -> None:
    own = made(superuser, name="admin-bot", group="auditors")
    theirs = made(auditor, name="audit-export", group="auditors")
    other = made(oncall)

    page = body(login(superuser).get("/tokens/"))

    mine, everyone = page.split("Everyone else's tokens</h2>", 1)
    assert f'id="token-{own.pk}"' in mine and f'id="token-{own.pk}"' not in everyone
    assert f"<td>{auditor.username}</td>" in row(everyone, theirs)
    assert f"<td>{oncall.username}</td>" in row(everyone, other)
    assert f'action="/tokens/{other.pk}/revoke/"' in row(everyone, other)


# --- making a token --------------------------------------------------------------------------


def test_making_a_token_shows_its_secret_once_and_stores_only_its_digest(oncall: User) -> None:
    client = login(oncall)

    response = make(client, name="triage-bot", days="7", auto_apply=AutoApply.ONE_TASK)

    # Rendered, not redirected: this answer is the only one with the secret.
    assert response.status_code == 200
    assert no_store(response)
    page = body(response)
    [secret] = set(secrets_in(page))
    assert "Copy it now: it is not shown again." in page
    assert f'<code class="secret" id="token-secret">{secret}</code>' in page
    assert (
        f"curl -H &quot;Authorization: Bearer {secret}&quot; http://127.0.0.1:8000/api/v1/tasks/"
        in page
    )
    assert 'hx-history="false"' in page
    token = ApiToken.objects.get()
    assert (token.user, token.name, token.group.name) == (oncall, "triage-bot", "oncall")
    assert token.auto_apply == AutoApply.ONE_TASK
    assert token.expires_at - token.created_at == pytest.approx(
        timedelta(days=7), abs=timedelta(minutes=1)
    )
    assert secret.startswith(f"tc_{token.prefix}_")
    assert token.digest == hashlib.sha256(secret.encode()).hexdigest()
    # The secret is nowhere in the database: not in the token's row, not in its event.
    stored = str(list(ApiToken.objects.values_list())) + str(list(Event.objects.values_list()))
    assert secret not in stored and secret.split("_", 2)[2] not in stored
    # The new token is listed, and the form is fresh.
    assert f'id="token-{token.pk}"' in page
    assert 'name="name" value=' not in page
    # Read again, the page has no secret.
    again = body(client.get("/tokens/"))
    assert secrets_in(again) == [] and secret.split("_", 2)[2] not in again
    assert f"tc_{token.prefix}_…" in again


def test_the_form_sent_again_makes_no_second_token_and_shows_no_secret(oncall: User) -> None:
    """A reload of the plain answer sends the form again: the name is taken by then."""
    client = login(oncall)
    first = make(client)

    again = make(client)

    assert first.status_code == 200 and again.status_code == 400
    assert secrets_in(body(again)) == []
    assert "has a live token named triage-bot" in body(again)
    assert ApiToken.objects.count() == 1
    assert len(token_events(EventKind.TOKEN_CREATED)) == 1


def test_making_a_token_over_htmx_answers_with_the_region_and_its_secret(oncall: User) -> None:
    response = make(login(oncall), headers=HTMX)

    assert response.status_code == 200
    assert no_store(response)
    page = body(response)
    assert "<html" not in page
    assert page.lstrip().startswith('<section id="tokens"')
    assert len(set(secrets_in(page))) == 1
    assert "Copy it now: it is not shown again." in page


def test_making_a_token_records_an_event_naming_its_maker(oncall: User) -> None:
    make(login(oncall))

    [event] = token_events(EventKind.TOKEN_CREATED)
    assert (event.actor, event.actor_user_id) == (oncall.username, oncall.pk)
    assert event.task_id is None
    assert "triage-bot" in event.reason


def test_a_superuser_may_take_the_permissions_of_any_group(superuser: User) -> None:
    response = make(login(superuser), group="editors")
    assert response.status_code == 200
    assert ApiToken.objects.get().group.name == "editors"


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"name": ""}, "name", "name: is required"),
        ({"name": "Triage Bot!"}, "name", "name: up to 64 of a-z"),
        ({"name": "a" * 65}, "name", "name: up to 64 of a-z"),
        ({"group": "auditors"}, "group", "group: one of the groups the token&#x27;s user is in"),
        ({"group": ""}, "group", "group: one of the groups"),
        ({"days": "0"}, "days", "days: a whole number from 1 to 365"),
        ({"days": "366"}, "days", "days: a whole number from 1 to 365"),
        ({"days": "soon"}, "days", "days: a whole number from 1 to 365"),
        ({"days": ""}, "days", "days: a whole number from 1 to 365"),
        ({"auto_apply": "always"}, "auto_apply", "auto_apply: one of never, one_task, any"),
    ],
)
@pytest.mark.parametrize("headers", [{}, HTMX], ids=["plain", "htmx"])
def test_bad_input_is_refused_on_its_field_and_stores_nothing(
    oncall: User, fields: dict[str, str], field: str, message: str, headers: dict[str, str]
) -> None:
    response = make(login(oncall), headers=headers, **fields)

    assert response.status_code == 400
    page = body(response)
    errors = re.search(rf'<div id="token-{field}_error">(.*?)</div>', page, re.S)
    assert errors and message in errors.group(1), page[:3000]
    assert ApiToken.objects.count() == 0
    assert token_events(EventKind.TOKEN_CREATED) == []
    assert secrets_in(page) == []
    assert "Copy it now" not in page
    # What was typed stays in the form.
    if fields.get("name"):
        assert f'value="{fields["name"]}"' in page


def test_a_second_live_token_of_the_same_name_is_refused_on_the_name(oncall: User) -> None:
    made(oncall)
    response = make(login(oncall))
    assert response.status_code == 400
    assert re.search(
        r'<div id="token-name_error"><p class="field-error" role="alert">name: '
        + f"{oncall.username} has a live token named triage-bot",
        body(response),
    )
    assert ApiToken.objects.count() == 1


def test_a_revoked_tokens_name_may_be_taken_again(oncall: User) -> None:
    tokens.revoke(made(oncall), actor=oncall, reason="rotated")
    assert make(login(oncall)).status_code == 200
    assert ApiToken.objects.filter(revoked_at=None).count() == 1


def test_the_form_is_only_posted(oncall: User) -> None:
    assert login(oncall).get("/tokens/new/").status_code == 405


# --- revoking a token ------------------------------------------------------------------------


def test_a_person_revokes_their_token_with_a_reason(oncall: User) -> None:
    token = made(oncall)
    client = login(oncall)

    response = revoke(client, token, "The bot was rewritten")

    assert response.status_code == 302 and response["Location"] == "/tokens/"
    token.refresh_from_db()
    assert token.revoked_at is not None and token.revoked_by == oncall.username
    [event] = token_events(EventKind.TOKEN_REVOKED)
    assert (event.actor, event.actor_user_id, event.reason) == (
        oncall.username,
        oncall.pk,
        "The bot was rewritten",
    )
    page = body(client.get("/tokens/"))
    assert f"Token triage-bot (tc_{token.prefix}_…) of {oncall.username} revoked" in page
    shown = row(page, token)
    assert '<span class="badge status-dead">revoked</span>' in shown
    assert f"by {oncall.username}, <time" in shown
    assert tokens.find(f"tc_{token.prefix}_x") is None


def test_a_revoke_over_htmx_answers_with_the_region_the_row_revoked(oncall: User) -> None:
    token = made(oncall)

    response = revoke(login(oncall), token, headers=HTMX)

    assert response.status_code == 200
    page = body(response)
    assert "<html" not in page and page.lstrip().startswith('<section id="tokens"')
    assert '<p class="notice success" role="status">Token triage-bot' in page
    assert '<span class="badge status-dead">revoked</span>' in row(page, token)


@pytest.mark.parametrize("headers", [{}, HTMX], ids=["plain", "htmx"])
@pytest.mark.parametrize("reason", ["", "   "])
def test_a_revoke_without_a_reason_is_refused_on_its_field(
    oncall: User, reason: str, headers: dict[str, str]
) -> None:
    token = made(oncall)
    other = made(oncall, name="other-bot")

    response = revoke(login(oncall), token, reason, headers=headers)

    assert response.status_code == 400
    page = body(response)
    error = f'<div id="revoke-{token.pk}-reason_error" class="revoke-error">'
    assert error in row(page, token)
    assert "reason: is required and may not be empty" in row(page, token)
    assert "field-error" not in row(page, other)
    token.refresh_from_db()
    assert token.revoked_at is None
    assert token_events(EventKind.TOKEN_REVOKED) == []


def test_revoking_a_revoked_token_answers_409_and_changes_nothing(oncall: User) -> None:
    token = made(oncall)
    tokens.revoke(token, actor=oncall, reason="first")

    response = revoke(login(oncall), token, "again", headers=HTMX)

    assert response.status_code == 409
    assert "token triage-bot is revoked already" in body(response)
    assert len(token_events(EventKind.TOKEN_REVOKED)) == 1


@pytest.mark.parametrize("headers", [{}, HTMX], ids=["plain", "htmx"])
def test_another_persons_token_is_not_found_and_stays_live(
    oncall: User, auditor: User, headers: dict[str, str]
) -> None:
    theirs = made(auditor, name="audit-export", group="auditors")

    response = revoke(login(oncall), theirs, "not mine", headers=headers)

    assert response.status_code == 404
    page = body(response)
    assert "audit-export" not in page and theirs.prefix not in page
    assert auditor.username not in page
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
    assert token_events(EventKind.TOKEN_REVOKED) == []


def test_an_unknown_token_is_not_found(oncall: User) -> None:
    response = login(oncall).post("/tokens/999999/revoke/", {"reason": "x"})
    assert response.status_code == 404


def test_a_superuser_revokes_anyones_token_and_the_event_names_them(
    oncall: User, superuser: User
) -> None:
    theirs = made(oncall)

    response = revoke(login(superuser), theirs, "oncall left the team")

    assert response.status_code == 302
    theirs.refresh_from_db()
    assert theirs.revoked_by == superuser.username
    [event] = token_events(EventKind.TOKEN_REVOKED)
    assert (event.actor, event.actor_user_id, event.reason) == (
        superuser.username,
        superuser.pk,
        "oncall left the team",
    )
    # Its owner sees who revoked it.
    assert f"by {superuser.username}, <time" in row(body(login(oncall).get("/tokens/")), theirs)


@pytest.mark.parametrize("headers", [{}, HTMX], ids=["plain", "htmx"])
def test_a_refusal_of_the_service_answers_403_with_nothing_of_the_token(
    oncall: User, monkeypatch: pytest.MonkeyPatch, headers: dict[str, str]
) -> None:
    token = made(oncall)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise NotPermitted("only its owner or a superuser may revoke a token of someone")

    monkeypatch.setattr(tokens, "revoke", refuse)

    response = revoke(login(oncall), token, headers=headers)

    assert response.status_code == 403
    page = body(response)
    assert "Not permitted" in page and "Only its owner or a superuser may revoke" in page
    assert "triage-bot" not in page and token.prefix not in page
    if headers:
        assert response["HX-Retarget"] == "#messages"
    token.refresh_from_db()
    assert token.revoked_at is None


def test_every_post_carries_the_csrf_token(oncall: User) -> None:
    made(oncall)
    page = body(login(oncall).get("/tokens/"))
    forms = re.findall(r'<form[^>]* method="post".*?</form>', page, re.S)
    # The new token's, the revoke's, and the header's log out.
    assert len(forms) == 3
    assert all('name="csrfmiddlewaretoken"' in form for form in forms)
    client = Client(enforce_csrf_checks=True)
    client.force_login(oncall)
    assert make(client).status_code == 403
    assert ApiToken.objects.count() == 1
