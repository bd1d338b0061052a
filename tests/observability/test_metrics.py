"""/metrics: what it reports (read from the database, on both paths), that its counters
never go down, and who may read it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F
from django.test import Client

from approvals import services as approvals
from tasks_app import services
from tasks_app.engine import fastpath, presence, runner
from tasks_app.exceptions import IdempotencyConflict
from tasks_app.models import Step, StepStatus, Task, TaskStatus
from tasks_app.operations import retention
from tests.approval_support import advance, article, pending_request
from tests.conftest import backdate, only_step
from tests.metrics_support import scrape, value
from tests.settings_support import PRODUCTION, load_settings


@pytest.fixture(params=["sql", "orm"])
def path(request: pytest.FixtureRequest, settings: Any) -> str:
    settings.TASKS_SQL_FAST_PATH = request.param == "sql"
    return str(request.param)


def drain(task: Task) -> None:
    runner.drain(only_step(task).pk)


@pytest.mark.django_db(transaction=True)
def test_the_metrics_report_the_work_and_its_history(client: Client, path: str) -> None:
    done = [services.enqueue("demo.noop", {"n": n}).task for n in range(3)]
    for task in done:
        drain(task)
    dead = services.enqueue("demo.flaky", {"error": "permanent", "fail_first": 9}).task
    drain(dead)
    waiting = services.enqueue("demo.noop", {"n": "waits"}).task
    backdate(only_step(waiting), 120)
    services.enqueue("demo.noop", {"n": 0}, idempotency_key="k-1")
    services.enqueue("demo.noop", {"n": 0}, idempotency_key="k-1")  # a duplicate
    with pytest.raises(IdempotencyConflict):
        services.enqueue("demo.noop", {"n": 1}, idempotency_key="k-1")
    services.pause_queue("default", actor="cli:oncall", reason="drill")
    presence.worker_started(
        presence.NodeInfo("celery@box", "box", 1, ["default"], 2, processes=[2])
    )
    services.sweep()

    samples = scrape(client)

    assert value(samples, "tasks_tasks", status="dead", workflow="demo.flaky") == 1
    assert value(samples, "tasks_tasks", status="pending", workflow="demo.noop") == 2
    assert (
        value(
            samples,
            "tasks_dead_steps",
            queue="default",
            error_class="tasks_app.exceptions.PermanentError",
        )
        == 1
    )
    assert value(samples, "tasks_enqueued_total", workflow="demo.noop") == 5
    assert value(samples, "tasks_enqueued_total", workflow="demo.flaky") == 1
    assert value(samples, "tasks_enqueue_duplicates_total") == 1
    assert value(samples, "tasks_idempotency_conflicts_total") == 1
    assert value(samples, "tasks_claims_total", queue="default") == 4
    assert value(samples, "tasks_events_total", kind="dead_lettered") == 1
    assert value(samples, "tasks_events_total", kind="queue_paused") == 1
    assert value(samples, "tasks_events_total", kind="stale_write_rejected") == 0
    assert value(samples, "tasks_step_duration_seconds_count") == 3
    assert value(samples, "tasks_step_duration_seconds_bucket", le="+Inf") == 3
    assert value(samples, "tasks_step_duration_seconds_bucket", le="300") == 3
    assert value(samples, "tasks_queue_due_steps", queue="default") == 2
    assert value(samples, "tasks_queue_lag_seconds", queue="default") >= 120
    assert value(samples, "tasks_queue_paused", queue="default") == 1
    assert value(samples, "tasks_workers", state="live") == 1
    assert value(samples, "tasks_workers", state="silent") == 0
    assert 0 <= value(samples, "tasks_sweeper_last_run_age_seconds") < 60


@pytest.mark.django_db(transaction=True)
def test_the_step_duration_histogram_puts_each_run_in_its_bucket(client: Client, path: str) -> None:
    drain(services.enqueue("demo.noop", {"n": "quick"}).task)
    slow = services.enqueue("demo.noop", {"n": "slow"}).task
    claim = services.claim_step(only_step(slow).pk, worker_id="box:1")
    assert claim is not None
    # As if the claim had been 42 s ago: the run lands between 30 and 60 s.
    Step.objects.filter(pk=claim.step_id).update(started_at=F("started_at") - timedelta(seconds=42))
    if path == "sql":
        fastpath.complete_many([(claim, {})])
    else:
        services.complete_step(claim, {})
    assert Step.objects.get(pk=claim.step_id).status == StepStatus.SUCCEEDED

    samples = scrape(client)
    buckets = {
        le: value(samples, "tasks_step_duration_seconds_bucket", le=le)
        for le in ("0.01", "30", "60", "+Inf")
    }
    # The quick one ran in well under 30 s (in a millisecond or a few hundred, by load).
    assert (buckets["30"], buckets["60"], buckets["+Inf"]) == (1, 2, 2)
    assert buckets["0.01"] <= 1
    assert 42 <= value(samples, "tasks_step_duration_seconds_sum") < 60


@pytest.mark.django_db(transaction=True)
def test_a_cancel_that_lands_while_the_step_runs_is_counted_once(client: Client, path: str) -> None:
    task = services.enqueue("demo.noop", {}).task
    claim = services.claim_step(only_step(task).pk, worker_id="box:1")
    assert claim is not None
    services.cancel(task, actor="cli:oncall", reason="not wanted")
    # The step's late success settles the task as cancelled (the hot path's statement
    # writes that event itself).
    if path == "sql":
        fastpath.complete_many([(claim, {})])
    else:
        services.complete_step(claim, {})
    assert Task.objects.get(pk=task.pk).status == TaskStatus.CANCELLED

    samples = scrape(client)
    assert value(samples, "tasks_events_total", kind="cancel_requested") == 1
    assert value(samples, "tasks_events_total", kind="cancelled") == 1


@pytest.mark.django_db(transaction=True)
def test_nothing_is_counted_for_an_enqueue_that_rolled_back(client: Client, path: str) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        services.enqueue("demo.noop", {})
        raise RuntimeError("the producer's transaction fails")

    assert value(scrape(client), "tasks_enqueued_total", workflow="demo.noop") == 0


@pytest.mark.django_db(transaction=True)
def test_the_event_counters_do_not_go_down_when_retention_prunes_history(
    client: Client, settings: Any
) -> None:
    task = services.enqueue("demo.flaky", {"fail_first": 1}).task
    drain(task)
    backdate(only_step(task))
    drain(task)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.SUCCEEDED
    before = scrape(client)
    Task.objects.filter(pk=task.pk).update(finished_at=F("finished_at") - timedelta(days=60))

    assert retention.prune(retention.cutoffs()).tasks[TaskStatus.SUCCEEDED] == 1
    after = scrape(client)

    assert value(before, "tasks_events_total", kind="retry_scheduled") == 1
    assert value(after, "tasks_events_total", kind="retry_scheduled") == 1
    assert value(before, "tasks_events_pruned_total", kind="retry_scheduled") == 0
    assert value(after, "tasks_events_pruned_total", kind="retry_scheduled") == 1
    assert value(after, "tasks_claims_total", queue="default") == 2


@pytest.mark.django_db(transaction=True)
def test_the_metrics_report_pending_approvals_and_how_long_decisions_took(
    client: Client, editor: User, remotes: Any
) -> None:
    waiting = advance(article())
    decided = advance(article(key="publish:article-002:v1"))
    request = pending_request(decided)
    type(request).objects.filter(pk=request.pk).update(
        created_at=F("created_at") - timedelta(minutes=10)
    )
    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)
    type(request).objects.filter(pk=pending_request(waiting).pk).update(
        created_at=F("created_at") - timedelta(hours=2)
    )

    samples = scrape(client)

    assert value(samples, "tasks_approvals_pending", workflow="publish_article") == 1
    assert (
        value(samples, "tasks_approval_oldest_pending_age_seconds", workflow="publish_article")
        >= 7200
    )
    histogram = {
        le: value(
            samples, "tasks_approval_decision_seconds_bucket", workflow="publish_article", le=le
        )
        for le in ("300", "900", "+Inf")
    }
    assert histogram == {"300": 0, "900": 1, "+Inf": 1}


# --- who may read it --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_metrics_answer_the_loopback_and_refuse_another_address(client: Client) -> None:
    assert client.get("/metrics").status_code == 200  # the test client is 127.0.0.1
    refused = client.get("/metrics", REMOTE_ADDR="10.1.2.3")
    assert refused.status_code == 403
    assert b"tasks_" not in refused.content


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("authorization", "status"),
    [("", 401), ("Bearer wrong", 401), ("Bearer s3cret-token", 200), ("s3cret-token", 401)],
)
def test_metrics_take_the_token_from_anywhere(
    client: Client, settings: Any, authorization: str, status: int
) -> None:
    settings.METRICS_TOKEN = "s3cret-token"
    headers = {"Authorization": authorization} if authorization else {}
    response = client.get("/metrics", REMOTE_ADDR="10.1.2.3", headers=headers)
    assert response.status_code == status
    if status == 401:
        assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.django_db(transaction=True)
def test_once_a_token_is_set_the_networks_no_longer_open_the_metrics(
    client: Client, settings: Any
) -> None:
    """A proxy on the web process's own machine makes every request come from loopback: a
    scraper anywhere would be let in as local. With a token, only the token opens them."""
    import ipaddress

    settings.METRICS_TOKEN = "s3cret-token"
    settings.METRICS_ALLOWED_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    for address in ("127.0.0.1", "10.1.2.3"):
        refused = client.get("/metrics", REMOTE_ADDR=address)
        assert refused.status_code == 401, address
        assert refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
        assert b"tasks_" not in refused.content
    bearer = {"Authorization": "Bearer s3cret-token"}
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1", headers=bearer).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_behind_a_trusted_proxy_the_networks_are_checked_against_the_client(
    client: Client, settings: Any
) -> None:
    """A proxy on the same machine connects from loopback: what it forwards for a client
    elsewhere is that client's request, not a local one."""
    import ipaddress

    settings.TRUSTED_PROXY_NETWORKS = [ipaddress.ip_network("127.0.0.1/32")]
    forwarded = client.get("/metrics", headers={"X-Forwarded-For": "203.0.113.9"})
    assert forwarded.status_code == 403
    assert b"tasks_" not in forwarded.content
    assert client.get("/metrics").status_code == 200  # a scraper on the machine itself


@pytest.mark.django_db(transaction=True)
def test_metrics_answer_an_allowed_network_and_none_means_none(
    client: Client, settings: Any
) -> None:
    import ipaddress

    settings.METRICS_ALLOWED_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.get("/metrics").status_code == 403  # loopback is no longer listed
    settings.METRICS_ALLOWED_NETWORKS = []
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403


def test_the_metrics_networks_setting_is_checked_and_none_allows_none() -> None:
    bad = load_settings(METRICS_ALLOWED_NETWORKS="10.0.0.0/8,intranet")
    assert bad.returncode != 0
    assert "METRICS_ALLOWED_NETWORKS must be comma-separated networks" in bad.stderr
    none = load_settings(
        "from django.conf import settings; print(settings.METRICS_ALLOWED_NETWORKS)",
        METRICS_ALLOWED_NETWORKS="none",
    )
    assert none.stdout.strip() == "[]", none.stderr


def test_a_production_process_answers_a_scraper_by_address_over_http() -> None:
    """Called by address over plain HTTP, the endpoint answers itself (here: refuses a
    scraper without the token) instead of Django's 400 for the host or 301 to HTTPS."""
    result = load_settings(
        "from django.test import Client; "
        "r = Client(HTTP_HOST='10.1.2.3', REMOTE_ADDR='10.9.9.9').get('/metrics'); "
        "print(r.status_code, r['WWW-Authenticate'])",
        **PRODUCTION,
        METRICS_TOKEN="t-1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'Bearer realm="metrics"'.join(["401 ", ""])
