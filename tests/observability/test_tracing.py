"""Traces of a task (``tasks_app.observability.tracing``): the enqueue, every attempt, every
effect and every person's decision in one trace, which the task row remembers; a caller's
traceparent continued; nothing at all with tracing off; the task page's link to the trace.

Spans go to an in-memory exporter that the tests hand to ``tracing.setup`` with
``TASKS_TRACING`` on. A decision's span is made when its transaction commits, so the
decisions run under ``django_capture_on_commit_callbacks(execute=True)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from approvals import services as approvals
from tasks_app import services
from tasks_app.engine import runner, tracing_hooks
from tasks_app.models import Step, Task, TaskStatus
from tasks_app.observability import tracing
from tests.approval_support import advance, article, current, pending_request
from tests.conftest import only_step
from tests.console_support import body, login
from tests.remotes import LoopbackRemote

BASE_URL = "https://console.example"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"

Commit = Callable[..., Any]

pytestmark = pytest.mark.django_db


@pytest.fixture
def spans(settings: Any) -> Iterator[InMemorySpanExporter]:
    """Tracing on, every span kept in memory; off again after the test."""
    settings.TASKS_TRACING = True
    settings.CONSOLE_BASE_URL = BASE_URL + "/"
    exporter = InMemorySpanExporter()
    assert tracing.setup(processors=[SimpleSpanProcessor(exporter)])
    yield exporter
    tracing.reset()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = named(exporter, name)
    assert len(found) == 1, [span.name for span in exporter.get_finished_spans()]
    return found[0]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_a_task_is_one_trace_with_its_attempts_effects_and_the_people_who_decided(
    spans: InMemorySpanExporter,
    editor: User,
    oncall: User,
    remotes: tuple[LoopbackRemote, LoopbackRemote],
    django_capture_on_commit_callbacks: Commit,
) -> None:
    publishing, _ = remotes
    task = advance(article())
    request = pending_request(task)
    with django_capture_on_commit_callbacks(execute=True):
        approvals.approve(
            request, actor=editor, comment="Good to go", draft_hash=request.draft_hash
        )
    # The remote fails once (tried again), then refuses for good: dead-lettered.
    publishing.answer_next(500, after_applying=False)
    publishing.answer_next(422, after_applying=False)
    task = advance(task, skip_backoff=True)
    assert task.status == TaskStatus.DEAD
    with django_capture_on_commit_callbacks(execute=True):
        services.redrive(
            task, actor=oncall, reason="The remote is fixed; its api_key=s3cr3t was rotated"
        )
    task = advance(task)
    assert task.status == TaskStatus.SUCCEEDED

    finished = spans.get_finished_spans()
    assert {span.context.trace_id for span in finished} == {finished[0].context.trace_id}
    enqueue = one(spans, "enqueue publish_article")
    assert task.traceparent == tracing.traceparent_of(enqueue.context)
    assert attrs(enqueue)["task.id"] == task.pk
    assert attrs(enqueue)["task.url"] == f"{BASE_URL}/tasks/{task.pk}/"
    assert attrs(enqueue)["task.workflow"] == "publish_article"

    publish = current(task, "publish")
    attempts = named(spans, "step publish")
    assert [attrs(span)["step.outcome"] for span in attempts] == [
        "retry_scheduled",
        "dead_lettered",
        "succeeded",
    ]
    assert [span.status.status_code for span in attempts] == [
        StatusCode.ERROR,
        StatusCode.ERROR,
        StatusCode.UNSET,
    ]
    assert [attrs(span)["step.fencing_token"] for span in attempts] == [1, 2, 3]
    assert [attrs(span)["step.attempt"] for span in attempts] == [1, 2, 1]
    assert attrs(attempts[1])["error.type"] == "tasks_app.exceptions.RemoteRefused"
    assert attrs(attempts[1])["step.id"] == publish.pk
    assert attrs(attempts[1])["step.position"] == 2
    assert attrs(attempts[1])["worker.id"] == runner.worker_id()
    assert attrs(attempts[1])["task.url"] == f"{BASE_URL}/tasks/{task.pk}/"
    for span in [*attempts, one(spans, "step generate_draft"), one(spans, "step cleanup")]:
        assert span.parent is not None and span.parent.span_id == enqueue.context.span_id

    effects = named(spans, "effect publish")
    assert [attrs(span)["effect.key"] for span in effects] == [
        f"{publish.idempotency_key}:publish"
    ] * 3
    assert [attrs(span)["effect.called"] for span in effects] == [True, True, True]
    assert [span.parent.span_id for span in effects if span.parent] == [
        span.context.span_id for span in attempts
    ]
    assert [span.status.status_code for span in effects] == [
        StatusCode.ERROR,
        StatusCode.ERROR,
        StatusCode.UNSET,
    ]

    approved = one(spans, "approved")
    assert attrs(approved)["enduser.id"] == editor.username
    assert attrs(approved)["decision.reason"] == "Good to go"
    redriven = one(spans, "redriven")
    assert attrs(redriven)["enduser.id"] == oncall.username
    assert "s3cr3t" not in attrs(redriven)["decision.reason"]
    assert attrs(redriven)["decision.reason"].startswith("The remote is fixed")
    for decision in (approved, redriven):
        assert decision.parent is not None
        assert decision.parent.span_id == enqueue.context.span_id
        assert attrs(decision)["task.id"] == task.pk


def test_every_decision_is_a_span_of_its_person_and_the_systems_own_events_are_not(
    spans: InMemorySpanExporter,
    editor: User,
    oncall: User,
    django_capture_on_commit_callbacks: Commit,
) -> None:
    rejected = advance(article(key="publish:rejected"))
    sent_back = advance(article(key="publish:sent-back"))
    dead = [
        services.enqueue("demo.flaky", {"fail_first": 1, "error": "permanent"}).task
        for _ in range(2)
    ]
    assert runner.drain(only_step(dead[0]).pk) == 2  # both, dead at once
    pending = services.enqueue("demo.noop", {}).task
    with django_capture_on_commit_callbacks(execute=True):
        request = pending_request(rejected)
        approvals.reject(request, actor=editor, comment="Off brand", draft_hash=request.draft_hash)
        request = pending_request(sent_back)
        approvals.request_changes(
            request, actor=editor, comment="Shorter, please", draft_hash=request.draft_hash
        )
        services.cancel(pending, actor=oncall, reason="Not needed")
        report = services.act_on_tasks(
            Task.objects.filter(pk__in=[task.pk for task in dead]),
            action="redrive",
            actor=oncall,
            reason="The bad input was fixed upstream",
            limit=10,
            plan="plan-42",
        )
    assert sorted(report.changed) == sorted(task.pk for task in dead)

    # The rejection's own `cancelled` (the system's) makes no span.
    decisions = [
        span for span in spans.get_finished_spans() if not span.name.startswith(("step", "enq"))
    ]
    by_task = sorted((attrs(span)["task.id"], span.name) for span in decisions)
    assert by_task == sorted(
        [
            (rejected.pk, "rejected"),
            (sent_back.pk, "changes_requested"),
            (pending.pk, "cancelled"),
            *((task.pk, "redriven") for task in dead),
        ]
    )
    for span in decisions:
        task = Task.objects.get(pk=attrs(span)["task.id"])
        assert f"{span.context.trace_id:032x}" == tracing.trace_id_of(task.traceparent)
    assert {attrs(span)["enduser.id"] for span in named(spans, "redriven")} == {oncall.username}
    assert {attrs(span)["decision.plan"] for span in named(spans, "redriven")} == {"plan-42"}
    assert attrs(one(spans, "changes_requested"))["decision.reason"] == "Shorter, please"
    assert attrs(one(spans, "rejected"))["enduser.id"] == editor.username
    assert attrs(one(spans, "cancelled"))["enduser.id"] == oncall.username


def test_a_replayed_effect_is_told_from_a_call(spans: InMemorySpanExporter) -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    claim = services.claim_step(step.pk, worker_id="w1")
    assert claim is not None
    effects = services.step_context(task, step, attempt=1, token=claim.token, timeout=None).effects
    assert effects.run("ping", lambda key: {"pong": key}, idempotent_remote=True)
    assert effects.run("ping", lambda key: {"again": key}, idempotent_remote=True)
    first, second = named(spans, "effect ping")
    assert (attrs(first)["effect.called"], attrs(first)["effect.replayed"]) == (True, False)
    assert (attrs(second)["effect.called"], attrs(second)["effect.replayed"]) == (False, True)


def test_a_traceparent_the_caller_hands_over_is_continued(spans: InMemorySpanExporter) -> None:
    with tracing.continuing(TRACEPARENT):
        task = services.enqueue("demo.noop", {"n": 1}).task
    assert runner.drain(only_step(task).pk) == 1

    enqueue = one(spans, "enqueue demo.noop")
    assert f"{enqueue.context.trace_id:032x}" == TRACE_ID
    assert enqueue.parent is not None and f"{enqueue.parent.span_id:016x}" == PARENT_ID
    assert tracing.trace_id_of(task.traceparent) == TRACE_ID
    # Claimed by the batch statement, which reads the stored traceparent with the task.
    step = one(spans, "step noop")
    assert f"{step.context.trace_id:032x}" == TRACE_ID
    assert attrs(step)["step.outcome"] == "succeeded"


def test_the_producers_active_span_is_the_enqueues_parent(spans: InMemorySpanExporter) -> None:
    producer = trace.get_tracer("a producer", tracer_provider=tracing._on.provider)  # type: ignore[union-attr]
    with producer.start_as_current_span("handle order") as outer:
        results = services.enqueue_many(
            [{"workflow": "demo.noop", "payload": {"n": n}} for n in range(3)]
        )
    enqueues = named(spans, "enqueue demo.noop")
    assert len(enqueues) == 3
    for span, result in zip(enqueues, results, strict=True):
        assert span.parent is not None and span.parent.span_id == outer.get_span_context().span_id
        assert result.task.traceparent == tracing.traceparent_of(span.context)
        stored = Task.objects.values_list("traceparent", flat=True).get(pk=result.task.pk)
        assert stored == result.task.traceparent


def test_the_orm_path_stores_the_traceparent_too(
    spans: InMemorySpanExporter, settings: Any
) -> None:
    settings.TASKS_SQL_FAST_PATH = False
    task = services.enqueue("demo.noop", {}, idempotency_key="orm:1").task
    task.refresh_from_db()
    assert task.traceparent == tracing.traceparent_of(one(spans, "enqueue demo.noop").context)
    again = services.enqueue("demo.noop", {}, idempotency_key="orm:1")
    assert not again.created and again.task.traceparent == task.traceparent
    assert [attrs(span)["task.created"] for span in named(spans, "enqueue demo.noop")] == [
        True,
        False,
    ]


def test_with_tracing_off_no_span_is_made_and_no_trace_is_stored(
    settings: Any, oncall: User, django_capture_on_commit_callbacks: Commit
) -> None:
    settings.TASKS_TRACING = False
    exporter = InMemorySpanExporter()
    assert not tracing.setup(processors=[SimpleSpanProcessor(exporter)])
    assert tracing_hooks.enqueue([]) is tracing_hooks.OFF
    assert tracing_hooks.attempts([], {}) is tracing_hooks.OFF
    assert tracing_hooks.effect("k", "n") is tracing_hooks.OFF

    with tracing.continuing(TRACEPARENT):
        task = services.enqueue("demo.flaky", {"fail_first": 1, "error": "permanent"}).task
    assert runner.drain(only_step(task).pk) == 1
    with django_capture_on_commit_callbacks(execute=True):
        services.redrive(task, actor=oncall, reason="try again")
    assert runner.drain(only_step(task).pk) == 1

    assert exporter.get_finished_spans() == ()
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert task.traceparent is None
    assert list(Task.objects.exclude(traceparent=None)) == []


def test_the_task_page_links_to_its_trace(settings: Any, oncall: User) -> None:
    task = services.enqueue("demo.noop", {}).task
    client = login(oncall)

    settings.TASKS_TRACE_URL = "https://jaeger.example/trace/{trace_id}"
    assert "jaeger.example" not in body(client.get(f"/tasks/{task.pk}/"))  # never traced

    Task.objects.filter(pk=task.pk).update(traceparent=TRACEPARENT)
    task.refresh_from_db()
    page = body(client.get(f"/tasks/{task.pk}/"))
    assert f'<a href="https://jaeger.example/trace/{TRACE_ID}" rel="noreferrer">Trace</a>' in page
    assert tracing.trace_url(task) == f"https://jaeger.example/trace/{TRACE_ID}"

    settings.TASKS_TRACE_URL = ""
    assert "jaeger.example" not in body(client.get(f"/tasks/{task.pk}/"))
    assert tracing.trace_url(task) is None


def test_a_traceparent_that_does_not_parse_names_no_trace() -> None:
    assert tracing.trace_id_of("00-" + "0" * 32 + "-" + PARENT_ID + "-01") is None
    assert tracing.trace_id_of("not a traceparent") is None
    assert tracing.context_of("00-xyz") is None
    assert tracing.trace_id_of(TRACEPARENT) == TRACE_ID


def test_a_step_of_a_task_enqueued_before_tracing_starts_a_trace_of_its_own(
    settings: Any,
) -> None:
    task = services.enqueue("demo.noop", {}).task
    exporter = InMemorySpanExporter()
    settings.TASKS_TRACING = True
    tracing.setup(processors=[SimpleSpanProcessor(exporter)])
    try:
        assert runner.drain(Step.objects.get(task=task).pk) == 1
    finally:
        tracing.reset()
    (step,) = exporter.get_finished_spans()
    assert step.name == "step noop" and step.parent is None
    assert attrs(step)["task.id"] == task.pk


def test_an_enqueue_through_the_api_continues_the_requests_traceparent(
    spans: InMemorySpanExporter, settings: Any
) -> None:
    from tests.api_support import call, token_for
    from tests.conftest import _user

    settings.TASKS_TRACE_URL = "https://traces.example/trace/{trace_id}"
    secret = token_for(_user("pia-producer", "producers"), "producers")
    answer = call(
        "POST",
        "/api/v1/tasks/",
        secret,
        body={"workflow": "demo.noop", "payload": {"n": 2}},
        traceparent=TRACEPARENT,
    )
    assert answer.status_code == 201
    enqueue = one(spans, "enqueue demo.noop")
    assert f"{enqueue.context.trace_id:032x}" == TRACE_ID
    task_id = answer.json()["task"]["id"]
    detail = call("GET", f"/api/v1/tasks/{task_id}", secret).json()
    assert detail["trace_url"] == f"https://traces.example/trace/{TRACE_ID}"
    assert attrs(enqueue)["task.url"] == f"{BASE_URL}/tasks/{task_id}/"
