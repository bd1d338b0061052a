"""The shipped workflows against their remotes (fakes on loopback): publishing happens
exactly once however often the step runs, and a mail whose fate is unknown waits for a
person."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals import services as approvals
from tasks_app import services
from tasks_app.demo import fakes
from tasks_app.engine import runner
from tasks_app.exceptions import InvalidPayload
from tasks_app.history import timeline
from tasks_app.models import Effect, Event, EventKind, Step, StepStatus, Task, TaskStatus
from tests.approval_support import (
    ARTICLE,
    TICKET,
    advance,
    article,
    current,
    pending_request,
    result_of,
    ticket,
)
from tests.conftest import backdate
from tests.remotes import LoopbackRemote

Remotes = tuple[LoopbackRemote, LoopbackRemote]


def _approved(task: Task, editor: User) -> Task:
    """Run the task to its review and approve what it shows."""
    task = advance(task)
    request = pending_request(task)
    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)
    return task


def _dead_letter_reason(task: Task) -> str:
    return str(
        Event.objects.for_task(task.pk).filter(kind=EventKind.DEAD_LETTERED).latest("id").reason
    )


# --- publish: the remote honours idempotency keys ---------------------------------------------


def test_publish_publishes_once_when_the_step_runs_twice(
    db: None, editor: User, remotes: Remotes
) -> None:
    publishing, _ = remotes
    task = _approved(article(), editor)
    step = current(task, "publish")
    claim = services.claim_step(step.pk, worker_id="doomed-worker")
    assert claim is not None
    # The handler publishes, then its worker dies before recording the step's result.
    runner._run_one(claim, Step.objects.select_related("task").get(pk=step.pk))
    assert len(publishing.applied) == 1
    backdate(step)  # its lease runs out ...
    assert services.sweep().reaped == 1  # ... and the step is due again

    task = advance(task)

    assert task.status == TaskStatus.SUCCEEDED
    step.refresh_from_db()
    assert (step.fencing_token, step.attempts) == (2, 2)
    # The second attempt found the recorded result and did not call again.
    assert len(publishing.received) == 1
    assert result_of(task, "publish")["remote_id"] == publishing.applied[0]["id"]


def test_publish_publishes_once_when_the_endpoint_times_out_after_accepting(
    db: None, editor: User, remotes: Remotes
) -> None:
    publishing, _ = remotes
    task = _approved(article(), editor)
    publishing.time_out_after_accepting(1)

    # The first attempt times out waiting for the answer. It runs alone: advance() would
    # also run the retry whenever its jittered wait happened to be short.
    assert runner.run_claimed(current(task, "publish").pk)

    step = current(task, "publish")
    assert (step.status, step.attempts) == (StepStatus.PENDING, 1)
    assert step.error_class == "builtins.TimeoutError"
    effect = Effect.objects.get(step=step)
    assert effect.status == Effect.Status.STARTED

    task = advance(task, skip_backoff=True)  # the retry sends the same key again

    assert task.status == TaskStatus.SUCCEEDED
    keys = [call["key"] for call in publishing.received]
    assert keys == [effect.key, effect.key]
    assert len(publishing.applied) == 1
    effect.refresh_from_db()
    assert effect.status == Effect.Status.DONE


def test_publish_refuses_a_draft_other_than_the_approved_one(
    db: None, editor: User, remotes: Remotes
) -> None:
    publishing, _ = remotes
    task = _approved(article(), editor)
    Step.objects.filter(pk=current(task, "generate_draft").pk).update(
        result={**result_of(task, "generate_draft"), "body": "not what the editor read"}
    )

    task = advance(task)

    assert task.status == TaskStatus.DEAD
    assert "not the draft that was approved" in current(task, "publish").last_error
    assert publishing.received == []


def test_a_refusing_remote_dead_letters_publish_without_leaving_an_unknown_effect(
    db: None, editor: User, settings: Any, remotes: Remotes
) -> None:
    # Not an http(s) URL: refused before anything is sent.
    settings.PUBLISH_URL = "file:///etc/passwd"
    task = advance(_approved(article(), editor))

    assert task.status == TaskStatus.DEAD
    assert _dead_letter_reason(task) == "permanent_error"
    assert not Effect.objects.filter(step=current(task, "publish")).exists()


def test_a_publish_resolved_by_hand_lets_the_cleanup_finish(
    db: None, editor: User, oncall: User, settings: Any, remotes: Remotes
) -> None:
    settings.PUBLISH_URL = "file:///etc/passwd"  # refused: the step dies
    task = advance(_approved(article(), editor))
    assert task.status == TaskStatus.DEAD

    services.resolve(task, actor=oncall, reason="published by hand in the CMS", outcome="done")
    task = advance(task)

    assert task.status == TaskStatus.SUCCEEDED
    assert result_of(task, "cleanup")["published_as"] is None


def test_an_unreachable_remote_is_retried_and_nothing_is_left_started(
    db: None, editor: User, settings: Any, remotes: Remotes
) -> None:
    publishing, _ = remotes
    url = publishing.url
    publishing.stop()  # nobody listens on its port any more
    settings.PUBLISH_URL = url
    task = _approved(article(), editor)
    # One attempt, run here: advance() would run a retry whose jittered wait happened to
    # be short again within the same call.
    assert runner.run_claimed(current(task, "publish").pk)

    step = current(task, "publish")
    assert (step.status, step.attempts) == (StepStatus.PENDING, 1)
    assert step.error_class == "tasks_app.exceptions.EffectNotApplied"
    assert not Effect.objects.filter(step=step).exists()


# --- send: the mail remote does not deduplicate ---------------------------------------------------


def _timed_out_reply(editor: User, mail: LoopbackRemote) -> Task:
    task = _approved(ticket(), editor)
    mail.time_out_after_accepting(1)
    task = advance(task)
    assert task.status == TaskStatus.DEAD
    assert _dead_letter_reason(task) == "outcome_unknown"
    assert current(task, "send").error_class == "tasks_app.exceptions.OutcomeUnknown"
    assert len(mail.applied) == 1  # it did go out, which only the remote knows
    return task


def test_a_send_that_timed_out_waits_for_a_person_who_says_it_happened(
    db: None, editor: User, oncall: User, remotes: Remotes
) -> None:
    _, mail = remotes
    task = _timed_out_reply(editor, mail)

    services.resolve(task, actor=oncall, reason="customer confirms receipt", outcome="done")

    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert result_of(task, "send")["note"] == "customer confirms receipt"
    assert Effect.objects.get(step=current(task, "send")).status == Effect.Status.DONE
    assert len(mail.received) == 1  # no second mail


def test_the_events_of_a_ticket_whose_mail_was_resolved_tell_its_whole_story(
    db: None, editor: User, oncall: User, remotes: Remotes
) -> None:
    _, mail = remotes
    task = _timed_out_reply(editor, mail)
    services.resolve(task, actor=oncall, reason="in the mail log", outcome="done")

    events = timeline.history(task.pk)
    assert [(event.kind, event.actor) for event in events] == [
        (EventKind.ENQUEUED, "cli:producer"),
        (EventKind.CLAIMED, "worker:" + events[1].actor.removeprefix("worker:")),
        (EventKind.SUCCEEDED, events[1].actor),  # lookup_customer
        (EventKind.CLAIMED, events[1].actor),
        (EventKind.SUCCEEDED, events[1].actor),  # draft_reply
        (EventKind.APPROVAL_REQUESTED, events[1].actor),  # review, opened by that success
        (EventKind.APPROVED, editor.username),
        (EventKind.CLAIMED, events[1].actor),
        (EventKind.DEAD_LETTERED, events[1].actor),  # send: outcome unknown
        (EventKind.RESOLVED, oncall.username),
    ]
    assert events[-1].data["task_status"] == TaskStatus.SUCCEEDED
    # (The autouse history check folds these events and compares them with the rows.)


def test_a_send_that_timed_out_waits_for_a_person_who_says_it_did_not(
    db: None, editor: User, oncall: User, remotes: Remotes
) -> None:
    _, mail = remotes
    task = _timed_out_reply(editor, mail)

    services.resolve(task, actor=oncall, reason="not in the mail log", outcome="retry")
    task = advance(task)

    assert task.status == TaskStatus.SUCCEEDED
    # Sent again, with the same step key: the person's call, and the ledger followed it.
    assert [call["key"] for call in mail.received] == [
        "reply:T-42:3:send:send",
        "reply:T-42:3:send:send",
    ]
    assert result_of(task, "send")["message_id"] == mail.applied[-1]["id"]


@pytest.mark.parametrize("status", [503, 429])
def test_a_send_answered_unavailable_after_the_mail_went_out_waits_for_a_person(
    db: None, editor: User, remotes: Remotes, status: int
) -> None:
    # A 503 or 429 proves nothing by itself: the remote may have acted before answering.
    _, mail = remotes
    mail.answer_next(status, after_applying=True)

    task = advance(_approved(ticket(), editor), skip_backoff=True)

    assert task.status == TaskStatus.DEAD
    assert current(task, "send").error_class == "tasks_app.exceptions.OutcomeUnknown"
    assert len(mail.applied) == 1  # sent once, and not again
    assert Effect.objects.get(step=current(task, "send")).status == Effect.Status.STARTED


@pytest.mark.parametrize("status", [503, 429])
def test_a_send_the_remote_says_it_did_not_apply_is_sent_again(
    db: None, editor: User, remotes: Remotes, status: int
) -> None:
    _, mail = remotes
    mail.answer_next(status, after_applying=False)

    task = advance(_approved(ticket(), editor), skip_backoff=True)

    assert task.status == TaskStatus.SUCCEEDED
    assert len(mail.applied) == 1
    assert result_of(task, "send")["message_id"] == mail.applied[0]["id"]


def test_a_publish_answered_unavailable_after_acting_is_called_again_with_its_key(
    db: None, editor: User, remotes: Remotes
) -> None:
    publishing, _ = remotes
    publishing.answer_next(503, after_applying=True)

    task = advance(_approved(article(), editor), skip_backoff=True)

    assert task.status == TaskStatus.SUCCEEDED
    keys = [call["key"] for call in publishing.received]
    assert len(keys) == 2 and keys[0] == keys[1]
    assert len(publishing.applied) == 1  # the remote applied the key once


def test_a_ticket_reply_sends_the_approved_draft_once(
    db: None, editor: User, remotes: Remotes
) -> None:
    _, mail = remotes
    task = advance(_approved(ticket(), editor))

    assert task.status == TaskStatus.SUCCEEDED
    draft = result_of(task, "draft_reply")
    assert [write["body"] for write in mail.applied] == [
        {"to": "acme-corp@customers.example", "subject": "Re: ticket T-42", "body": draft["body"]}
    ]
    assert "Acme Corp" in draft["body"] and TICKET["message"] in draft["body"]


def test_the_remotes_are_sent_their_tokens_and_no_token_when_none_is_set(
    db: None, editor: User, remotes: Remotes, settings: Any
) -> None:
    publishing, mail = remotes
    settings.PUBLISH_TOKEN, settings.MAIL_TOKEN = "publish-secret", ""

    advance(_approved(article(), editor))
    advance(_approved(ticket(), editor))

    assert publishing.authorizations == ["Bearer publish-secret"]
    assert mail.authorizations == [None]


# --- payloads -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workflow", "payload", "field", "rule"),
    [
        ("publish_article", {**ARTICLE, "title": ""}, "payload.title", "required"),
        ("publish_article", {"article_id": "a", "title": "t"}, "payload.brief", "required"),
        ("publish_article", {**ARTICLE, "title": 7}, "payload.title", "required"),
        ("publish_article", {**ARTICLE, "title": "t" * 301}, "payload.title", "max_length"),
        ("publish_article", {**ARTICLE, "extra": "x"}, "payload.extra", "known_field"),
        ("ticket_reply", {**TICKET, "customer_id": " "}, "payload.customer_id", "required"),
        ("ticket_reply", {**TICKET, "message": "m" * 10_001}, "payload.message", "max_length"),
    ],
)
def test_a_bad_payload_is_refused_naming_the_field_and_nothing_is_stored(
    db: None, workflow: str, payload: dict[str, Any], field: str, rule: str
) -> None:
    with pytest.raises(InvalidPayload) as refused:
        services.enqueue(workflow, payload, idempotency_key="bad:1")

    assert (refused.value.field, refused.value.rule) == (field, rule)
    assert field in str(refused.value)
    assert not Task.objects.exists() and not Event.objects.exists()


# --- the fakes the app serves for `make run` -----------------------------------------------


FAKES_TOKEN = "t" * 64


@pytest.fixture
def served_fakes(settings: Any) -> Any:
    """The fakes served as `make run` serves them (the test settings run on PostgreSQL,
    where they are off by default), with a known token."""
    settings.ROOT_URLCONF = "tests.fake_served_urls"
    settings.FAKE_REMOTES_TOKEN = FAKES_TOKEN
    fakes.publishing.reset()
    fakes.mail.reset()
    yield fakes.publishing, fakes.mail
    fakes.publishing.reset()
    fakes.mail.reset()


def _post(client: Client, url: str, body: Any, key: str, token: str | None = FAKES_TOKEN) -> Any:
    headers = {"Idempotency-Key": key}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return client.post(url, json.dumps(body), content_type="application/json", headers=headers)


def test_the_served_publishing_fake_applies_a_key_once(
    client: Client, admin_user: Any, served_fakes: Any
) -> None:
    publishing, _ = served_fakes
    first = _post(client, "/fake/publish/", {"title": "a"}, "k-1")
    again = _post(client, "/fake/publish/", {"title": "a"}, "k-1")

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == {**first.json(), "replayed": True}
    assert len(publishing.applied) == 1
    client.force_login(admin_user)
    assert client.get("/fake/publish/").json()["applied"] == publishing.applied


def test_the_served_mail_fake_sends_every_request(client: Client, served_fakes: Any) -> None:
    _, mail = served_fakes
    first = _post(client, "/fake/mail/", {"to": "a@example.org"}, "k-1")
    again = _post(client, "/fake/mail/", {"to": "a@example.org"}, "k-1")

    assert (first.status_code, again.status_code) == (201, 201)
    assert first.json()["id"] != again.json()["id"]
    assert len(mail.applied) == 2
    refused = client.post(
        "/fake/mail/",
        "{oops",
        content_type="application/json",
        headers={"Authorization": f"Bearer {FAKES_TOKEN}"},
    )
    assert refused.status_code == 400


@pytest.mark.parametrize("url", ["/fake/publish/", "/fake/mail/"])
@pytest.mark.parametrize("token", [None, "", "t" * 63, "x" * 64])
def test_the_served_fakes_refuse_a_write_without_their_token(
    client: Client, admin_user: Any, served_fakes: Any, url: str, token: str | None
) -> None:
    # Not even for a logged-in user: a session alone would make the write a CSRF target.
    client.force_login(admin_user)
    refused = _post(client, url, {"to": "a@example.org"}, "k-1", token=token)

    assert refused.status_code == 401
    assert refused["WWW-Authenticate"].startswith("Bearer")
    assert all(not remote.received for remote in served_fakes)


@pytest.mark.parametrize("url", ["/fake/publish/", "/fake/mail/"])
def test_the_served_fakes_show_their_writes_only_after_a_login(
    client: Client, admin_user: Any, served_fakes: Any, url: str
) -> None:
    _post(client, url, {"to": "secret@example.org"}, "k-1")

    anonymous = client.get(url)
    client.force_login(admin_user)
    logged_in = client.get(url)

    assert anonymous.status_code == 401
    assert b"secret@example.org" not in anonymous.content
    assert logged_in.status_code == 200
    assert logged_in.json()["applied"][0]["body"] == {"to": "secret@example.org"}


# --- demo.deliver (the fault drills' write) ---------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("payload", "field", "rule"),
    [
        ({}, "payload.remote", "choice"),
        ({"remote": "fax"}, "payload.remote", "choice"),
        ({"remote": "mail", "sleep": -1}, "payload.sleep", "range"),
        ({"remote": "mail", "linger": True}, "payload.linger", "range"),
        ({"remote": "mail", "linger": 61}, "payload.linger", "range"),
        ({"remote": "mail", "extra": 1}, "payload.extra", "known_field"),
    ],
)
def test_a_delivery_refuses_a_bad_payload_by_field_and_stores_nothing(
    payload: dict[str, Any], field: str, rule: str
) -> None:
    with pytest.raises(InvalidPayload) as caught:
        services.enqueue("demo.deliver", payload)
    assert (caught.value.field, caught.value.rule) == (field, rule)
    assert not Task.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("honours_key", [True, False], ids=["publish", "mail"])
def test_a_delivery_writes_once_to_its_remote_through_the_ledger(
    remotes: Remotes, honours_key: bool
) -> None:
    publishing, mail = remotes
    remote = publishing if honours_key else mail
    task = services.enqueue("demo.deliver", {"remote": "publish" if honours_key else "mail"}).task
    step = Step.objects.get(task=task)

    assert runner.run_claimed(step.pk)

    step.refresh_from_db()
    [write] = remote.applied
    assert step.status == StepStatus.SUCCEEDED
    assert step.result == {"remote_id": write["id"]}
    assert Effect.objects.get(step=step).key == write["key"]
    assert not (mail if honours_key else publishing).applied
