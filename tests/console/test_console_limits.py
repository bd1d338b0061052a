"""The Limits page: each limit's use now in words, where its numbers come from, its keys at
their limit with the tasks holding them; on-call's live changes (a change previewed then
confirmed, put back, a key paused and resumed), each with a reason and an audited event;
and everyone else reading it without a form, refused 403 with nothing of the limit."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tasks_app.db.clock import db_now
from tasks_app.models import Event, EventKind, LimitKey, LimitState
from tasks_app.operations import limits
from tests.console_support import HTMX, body, login
from tests.limit_support import claim
from tests.limits_page_support import CALLS, CUSTOMERS, busy, enqueue, limited_flow

pytestmark = pytest.mark.django_db

CHANGE = f"/limits/{CUSTOMERS.name}/change/"
SEEN = re.compile(r'name="seen" value="([^"]*)"')
LIMIT_KINDS = [EventKind.LIMIT_CHANGED, EventKind.LIMIT_KEY_PAUSED, EventKind.LIMIT_KEY_RESUMED]


@pytest.fixture(autouse=True)
def flow() -> Iterator[str]:
    with limited_flow() as name:
        yield name


def limit_rows() -> tuple[Any, ...]:
    """Every row a limit's action could change."""
    return (
        list(LimitState.objects.order_by("name").values_list()),
        list(LimitKey.objects.order_by("limit", "key").values_list()),
        list(Event.objects.order_by("pk").values_list("pk", "kind")),
    )


def limit_events() -> list[tuple[str, str, str, dict[str, Any]]]:
    return [
        (event.kind, event.actor, event.reason, event.data)
        for event in Event.objects.filter(kind__in=LIMIT_KINDS).order_by("pk")
    ]


def preview(client: Client, **fields: str) -> tuple[int, str]:
    data = {"concurrency": "3", "rate": "", "reason": "acme raised our quota", **fields}
    response = client.post(CHANGE, data, headers=HTMX)
    return response.status_code, body(response)


def confirm(client: Client, **fields: str) -> Any:
    """Preview, then confirm what the preview showed, as the page's two buttons do."""
    status, page = preview(client, **fields)
    assert status == 200, page
    seen = SEEN.search(page)
    assert seen, page
    data = {"concurrency": "3", "rate": "", "reason": "acme raised our quota", **fields}
    return client.post(CHANGE, {**data, "seen": seen.group(1), "confirm": "1"})


# --- reading ---------------------------------------------------------------------------------


def test_each_limit_says_its_use_now_in_words_with_the_tasks_holding_it(oncall: User) -> None:
    steps = busy()
    page = body(login(oncall).get("/limits/"))

    customers = page[page.index(f'id="limit-{CUSTOMERS.name}"') :]
    assert "2 running and 2 waiting across 2 keys; 2 at their limit" in customers
    assert "The declaration in code" in customers
    assert '<a href="/workflows/test.limits_page/">test.limits_page</a>' in customers
    rows = dict(re.findall(r'<span class="mono">(\w+)</span></th>(.*?)</tr>', customers, re.S))
    # Each key at its concurrency, held by its running task; acme's waiting ones come first.
    assert list(rows) == ["acme", "globex"]
    acme_task = steps["acme"][0].task_id
    assert "1/1 running" in rows["acme"] and "<td>2</td>" in rows["acme"]
    assert f'<a href="/tasks/{acme_task}/">#{acme_task}</a>' in rows["acme"]
    assert "when one of its running steps ends" in rows["acme"]
    assert "at its concurrency" in rows["acme"]
    assert "<td>0</td>" in rows["globex"]

    calls = page[page.index(f'id="limit-{CALLS.name}"') :]
    assert "2 running; 2 of 4 this minute; 2 waiting" in calls
    assert "It has room" in calls


def test_a_rate_at_its_ceiling_says_when_the_next_step_may_start(oncall: User) -> None:
    for n in range(5):
        enqueue(f"c{n}")
    assert len(claim()) == 4
    calls = body(login(oncall).get("/limits/"))
    calls = calls[calls.index(f'id="limit-{CALLS.name}"') :]
    assert "4 running; 4 of 4 this minute; 1 waiting" in calls
    assert "at its rate" in calls
    assert re.search(r'<td><time datetime="[^"]+" title="in [^"]+" data-when="full">', calls)


def test_paused_and_held_keys_say_who_why_when_and_until_when(oncall: User) -> None:
    busy()
    limits.pause_key(CUSTOMERS.name, "acme", actor=oncall, reason="acme asked for a pause")
    LimitKey.objects.filter(limit=CALLS.name, key="").update(
        held_until=db_now() + timedelta(minutes=2), held_reason="the remote answered 429"
    )
    page = body(login(oncall).get("/limits/"))

    customers = page[page.index(f'id="limit-{CUSTOMERS.name}"') :]
    assert "paused</span> by olivia-oncall" in customers
    assert "“acme asked for a pause”" in customers
    assert "when someone resumes it" in customers
    calls = page[page.index(f'id="limit-{CALLS.name}"') :]
    assert "held by its remote</span> until" in calls
    assert "“the remote answered 429”" in calls


def test_a_live_change_says_who_made_it_and_what_code_says(oncall: User) -> None:
    limits.change_limit(CUSTOMERS.name, actor=oncall, reason="r", concurrency=5, rate="10/m")
    page = body(login(oncall).get("/limits/"))
    customers = page[page.index(f'id="limit-{CUSTOMERS.name}"') :]
    assert "5 at once, 10/m" in customers
    assert "Changed live by olivia-oncall" in customers
    assert "(code and settings say 1 at once)" in customers


@pytest.mark.parametrize("role", ["editor", "auditor"])
def test_readers_without_the_permission_see_the_page_without_its_forms(
    role: str, request: pytest.FixtureRequest
) -> None:
    busy()
    page = body(login(request.getfixturevalue(role)).get("/limits/"))
    assert f'id="limit-{CUSTOMERS.name}"' in page and "1/1 running" in page
    assert "/change/" not in page and '<form method="post" action="/limits/' not in page


def test_the_nav_offers_limits_after_queues(oncall: User) -> None:
    page = body(login(oncall).get("/limits/"))
    nav = page[page.index('<nav aria-label="Sections">') :]
    assert nav.index(">Queues<") < nav.index(">Limits<")
    assert 'href="/limits/" aria-current="page">Limits<' in nav


def test_the_poll_answers_with_the_figures_only(oncall: User) -> None:
    busy()
    client = login(oncall)
    page = body(client.get("/limits/"))
    # Each card's figures are swapped in by the poller; a dot in a name is escaped there.
    oob = re.search(r'hx-select-oob="([^"]+)"', page)
    assert oob is not None
    assert {"#use-page\\.calls", "#use-page_customers"} <= set(oob.group(1).split(", "))

    polled = body(client.get("/limits/", headers=HTMX))
    assert 'id="limits-updated"' in polled and "data-poll" in polled
    assert 'id="use-page.calls"' in polled and 'id="use-page_customers"' in polled
    assert "1/1 running" in polled
    assert "<form" not in polled and "<html" not in polled and "<h1" not in polled


def test_the_poll_says_when_the_set_of_limits_changed(oncall: User) -> None:
    polled = body(login(oncall).get("/limits/?shown=0123456789ab", headers=HTMX))
    assert "Limits were added or removed since this page was loaded" in polled
    assert "?shown=0123456789ab" in polled  # so it keeps saying so until a reload


# --- who may act -----------------------------------------------------------------------------

ACTIONS = [
    (CHANGE, {"concurrency": "9", "rate": "", "reason": "r", "confirm": "1"}),
    (f"/limits/{CUSTOMERS.name}/reset/", {"reason": "r"}),
    (f"/limits/{CUSTOMERS.name}/pause/", {"key": "acme", "reason": "r"}),
    (f"/limits/{CUSTOMERS.name}/resume/", {"key": "acme", "reason": "r"}),
]


@pytest.mark.parametrize(("url", "data"), ACTIONS)
def test_an_anonymous_visitor_is_sent_to_the_login(
    client: Client, url: str, data: dict[str, str]
) -> None:
    for response in (client.get("/limits/"), client.post(url, data)):
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/?next=")


@pytest.mark.parametrize("role", ["editor", "auditor", "outsider"])
@pytest.mark.parametrize(("url", "data"), ACTIONS)
@pytest.mark.parametrize("headers", [{}, HTMX], ids=["plain", "htmx"])
def test_others_are_refused_with_nothing_of_the_limit(
    role: str,
    url: str,
    data: dict[str, str],
    headers: dict[str, str],
    request: pytest.FixtureRequest,
) -> None:
    busy()
    LimitKey.objects.filter(limit=CUSTOMERS.name, key="acme").update(
        paused_at=db_now(), paused_by="cli:x", paused_reason="x"
    )
    before = limit_rows()

    response = login(request.getfixturevalue(role)).post(url, data, headers=headers)

    assert response.status_code == 403
    page = body(response)
    assert "Not permitted" in page
    for shown in (CUSTOMERS.name, "acme", "running", '<form method="post" action="/limits'):
        assert shown not in page, f"{shown!r} shown behind a refusal"
    assert limit_rows() == before


def test_an_unknown_limit_is_not_found(oncall: User) -> None:
    response = login(oncall).post("/limits/nonesuch/pause/", {"key": "", "reason": "r"})
    assert response.status_code == 404
    assert LimitKey.objects.count() == 0 and limit_events() == []


# --- changing its numbers --------------------------------------------------------------------


def test_a_preview_says_what_the_change_lets_start_and_changes_nothing(oncall: User) -> None:
    busy()
    before = limit_rows()
    status, page = preview(login(oncall))

    assert status == 200
    assert "page_customers: 1 at once → 3 at once. It lets 2 waiting steps start now." in page
    assert "Nothing has changed yet." in page
    assert 'name="confirm" value="1"' in page and ">Apply 3 at once</button>" in page
    assert re.search(r'name="concurrency" value="3"[^>]*readonly', page)
    # The answer is the card alone, its actions open.
    assert page.lstrip().startswith(f'<section id="limit-{CUSTOMERS.name}"')
    assert '<details class="limit-actions" open>' in page
    assert limit_rows() == before


def test_a_confirm_changes_the_numbers_and_records_who_and_why(oncall: User) -> None:
    busy()
    client = login(oncall)
    response = confirm(client)

    assert response.status_code == 302
    assert response["Location"] == f"/limits/#limit-{CUSTOMERS.name}"
    state = LimitState.objects.get(name=CUSTOMERS.name)
    assert (state.overridden, state.concurrency, state.rate) == (True, 3, "")
    [(kind, actor, reason, data)] = limit_events()
    assert (kind, actor, reason) == (
        EventKind.LIMIT_CHANGED,
        "olivia-oncall",
        "acme raised our quota",
    )
    assert (data["before"], data["after"]) == (
        {"concurrency": 1, "rate": None},
        {"concurrency": 3, "rate": None},
    )
    page = body(client.get(response["Location"]))
    assert "Limit page_customers changed to 3 at once." in page
    assert "Changed live by olivia-oncall" in page
    # On-call, who may not read the audit log, reads the change and its reason on the card.
    assert "<strong>olivia-oncall</strong> changed 1 at once → 3 at once," in page
    assert ": “acme raised our quota”</li>" in page


def test_an_htmx_confirm_answers_with_the_card_and_its_notice(oncall: User) -> None:
    busy()
    client = login(oncall)
    status, page = preview(client, concurrency="2", rate="100/m")
    seen = SEEN.search(page)
    assert status == 200 and seen
    data = {"concurrency": "2", "rate": "100/m", "reason": "quota", "seen": seen.group(1)}
    response = client.post(CHANGE, {**data, "confirm": "1"}, headers=HTMX)
    answer = body(response)
    assert response.status_code == 200
    assert answer.lstrip().startswith(f'<section id="limit-{CUSTOMERS.name}"')
    assert "Limit page_customers changed to 2 at once, 100/m." in answer
    assert "2 at once, 100/m" in answer and "Put back" in answer
    assert LimitState.objects.get(name=CUSTOMERS.name).rate == "100/m"


def test_a_confirm_after_someone_else_changed_it_is_refused(oncall: User) -> None:
    client = login(oncall)
    status, page = preview(client)
    seen = SEEN.search(page)
    assert status == 200 and seen
    limits.change_limit(CUSTOMERS.name, actor="cli:ann", reason="meanwhile", concurrency=7, rate="")
    before = limit_rows()
    data = {"concurrency": "3", "rate": "", "reason": "mine", "seen": seen.group(1), "confirm": "1"}

    response = client.post(CHANGE, data, headers=HTMX)

    assert response.status_code == 409
    assert "Nothing changed: the numbers of page_customers were changed since your preview" in (
        body(response)
    )
    assert limit_rows() == before


@pytest.mark.parametrize(
    ("fields", "errors"),
    [
        ({"concurrency": "-1"}, ["concurrency: a whole number from 0"]),
        ({"concurrency": "many"}, ["concurrency: a whole number from 0"]),
        ({"concurrency": "", "rate": "fast"}, ["rate: rate &#x27;fast&#x27;: write it as"]),
        ({"concurrency": "", "rate": ""}, ["concurrency: set it, a rate, or both"]),
        ({"reason": "  "}, ["reason: is required"]),
        ({"rate": "0/s", "reason": ""}, ["rate: rate", "reason: is required"]),
    ],
)
@pytest.mark.parametrize("confirmed", [False, True], ids=["preview", "confirm"])
def test_bad_input_names_the_field_and_stores_nothing(
    oncall: User, fields: dict[str, str], errors: list[str], confirmed: bool
) -> None:
    before = limit_rows()
    data = {"concurrency": "3", "rate": "", "reason": "why", **fields}
    if confirmed:
        data.update(confirm="1", seen="1 -")
    response = login(oncall).post(CHANGE, data, headers=HTMX)

    assert response.status_code == 400
    page = body(response)
    for error in errors:
        assert re.search(rf'<p class="field-error" role="alert">{re.escape(error)}', page), page
    assert "Preview:" not in page
    assert limit_rows() == before


def test_put_back_returns_to_code_and_records_it(oncall: User) -> None:
    limits.change_limit(CUSTOMERS.name, actor=oncall, reason="r", concurrency=5, rate="")
    client = login(oncall)
    url = f"/limits/{CUSTOMERS.name}/reset/"
    empty = client.post(url, {"reason": ""}, headers=HTMX)
    assert empty.status_code == 400 and "reason: is required" in body(empty)
    assert LimitState.objects.get(name=CUSTOMERS.name).overridden

    response = client.post(url, {"reason": "quota back to normal"}, headers=HTMX)

    assert response.status_code == 200
    assert "Limit page_customers is back to 1 at once, as code and settings say." in body(response)
    assert not LimitState.objects.get(name=CUSTOMERS.name).overridden
    assert limit_events()[-1][:3] == (
        EventKind.LIMIT_CHANGED,
        "olivia-oncall",
        "quota back to normal",
    )


# --- pausing and resuming a key --------------------------------------------------------------


def test_a_key_is_paused_and_resumed_with_a_reason(oncall: User) -> None:
    busy()
    client = login(oncall)
    paused = client.post(
        f"/limits/{CUSTOMERS.name}/pause/", {"key": "acme", "reason": "acme asked"}, headers=HTMX
    )
    assert paused.status_code == 200
    assert "Key acme of page_customers paused." in body(paused)
    assert "Resume a paused key" in body(paused)
    row = LimitKey.objects.get(limit=CUSTOMERS.name, key="acme")
    assert (row.paused_by, row.paused_reason) == ("olivia-oncall", "acme asked")

    resumed = client.post(f"/limits/{CUSTOMERS.name}/resume/", {"key": "acme", "reason": "done"})

    assert resumed.status_code == 302
    assert LimitKey.objects.get(pk=row.pk).paused_at is None
    assert [(kind, actor, reason, data["key"]) for kind, actor, reason, data in limit_events()] == [
        (EventKind.LIMIT_KEY_PAUSED, "olivia-oncall", "acme asked", "acme"),
        (EventKind.LIMIT_KEY_RESUMED, "olivia-oncall", "done", "acme"),
    ]
    again = client.post(f"/limits/{CUSTOMERS.name}/resume/", {"key": "acme", "reason": "x"})
    assert again.status_code == 302 and len(limit_events()) == 2
    assert "Key acme of page_customers was not paused; nothing changed." in body(
        client.get("/limits/")
    )


def test_a_key_nobody_uses_yet_may_be_paused_and_the_notice_says_so(oncall: User) -> None:
    response = login(oncall).post(
        f"/limits/{CUSTOMERS.name}/pause/", {"key": "initech", "reason": "not yet"}, headers=HTMX
    )
    assert response.status_code == 200
    assert "Key initech of page_customers paused (no step runs or waits under it now)." in (
        body(response)
    )


def test_an_unpartitioned_limit_is_paused_whole(oncall: User) -> None:
    client = login(oncall)
    url = f"/limits/{CALLS.name}/pause/"
    keyed = client.post(url, {"key": "acme", "reason": "r"}, headers=HTMX)
    assert keyed.status_code == 400 and "key: limit page.calls has no keys" in body(keyed)
    assert LimitKey.objects.count() == 0

    whole = client.post(url, {"key": "", "reason": "provider incident"}, headers=HTMX)

    assert whole.status_code == 200
    assert "Limit page.calls paused" in body(whole)
    assert "the whole limit" in body(whole) and "Resume it" in body(whole)
    assert LimitKey.objects.get(limit=CALLS.name, key="").paused_reason == "provider incident"


def test_a_pause_without_a_reason_names_it_and_stores_nothing(oncall: User) -> None:
    busy()
    before = limit_rows()
    response = login(oncall).post(
        f"/limits/{CUSTOMERS.name}/pause/", {"key": "acme", "reason": ""}, headers=HTMX
    )
    assert response.status_code == 400
    assert re.search(r'<p class="field-error" role="alert">reason: is required', body(response))
    assert limit_rows() == before
