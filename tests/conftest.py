"""Shared fixtures: personas, time travel by back-dating rows, the broker's view, and the
history check run after every test that touched the database."""

from __future__ import annotations

import base64
import importlib
import json
import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from django.apps import apps as django_apps
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management.base import CommandError
from django.db import connection
from django.db.backends.base.creation import TEST_DATABASE_PREFIX
from django.db.models import F
from django.test import TransactionTestCase

from tasks_app.engine.dispatch import publisher
from tasks_app.history import StepState, TaskState, counting, fold_events, timeline
from tasks_app.models import Step, Task
from tasks_app.workflows import StepContext, StepSpec, Workflow, register, registry
from tests.remotes import LoopbackRemote, loopback_remotes

# Fixtures of their own modules: a Redis server a test may fill or turn read-only.
pytest_plugins = ["tests.redis_support"]

BROKER_PREFIX = os.environ.get("TASKS_BROKER_PREFIX", "")


# --- personas ------------------------------------------------------------------------------


def ensure_groups() -> None:
    """Transactional tests flush the database, taking the migration-made groups along."""
    if Group.objects.filter(name__in=["oncall", "auditors"]).count() < 2:
        migration = importlib.import_module(
            "tasks_app.migrations.0002_event_append_only_and_groups"
        )
        migration.create_groups(django_apps, None)
    if not Group.objects.filter(name="oncall", permissions__codename="change_limits").exists():
        limits = importlib.import_module("tasks_app.migrations.0024_limit_actions")
        limits.give_permission(django_apps, None)
    if not Group.objects.filter(name="oncall", permissions__codename="manage_schedules").exists():
        schedules = importlib.import_module("tasks_app.migrations.0028_schedules")
        schedules.give_permission(django_apps, None)
    if not Group.objects.filter(name="producers").exists():
        programs = importlib.import_module("tasks_app.migrations.0029_programs")
        programs.create_producers(django_apps, None)
    editors = importlib.import_module("approvals.migrations.0002_editors_group")
    for name in ("editors", "senior_editors"):
        if not Group.objects.filter(name=name).exists():
            editors.create_group(django_apps, None, name=name)


def _user(username: str, *groups: str, superuser: bool = False) -> User:
    ensure_groups()
    user = User.objects.create_user(username=username, password="pw-" + username)
    if superuser:
        user.is_staff = user.is_superuser = True
        user.save()
    for name in groups:
        user.groups.add(Group.objects.get(name=name))
    return user


@pytest.fixture
def oncall(db: None) -> User:
    return _user("olivia-oncall", "oncall")


@pytest.fixture
def auditor(db: None) -> User:
    return _user("aaron-auditor", "auditors")


@pytest.fixture
def outsider(db: None) -> User:
    return _user("otto-outsider")


@pytest.fixture
def editor(db: None) -> User:
    return _user("edith-editor", "editors")


@pytest.fixture
def producer(db: None) -> User:
    """A program's owner whose tokens enqueue: of ``producers`` (enqueue, read tasks)."""
    return _user("pia-producer", "producers")


@pytest.fixture
def other_editor(db: None) -> User:
    return _user("eddie-editor", "editors")


@pytest.fixture
def senior_editor(db: None) -> User:
    """Of the second group a request escalates to (press_release's senior_editors)."""
    return _user("selma-senior", "senior_editors")


@pytest.fixture
def author(db: None) -> User:
    """An editor who also writes: enqueues tasks, so may not decide on them."""
    return _user("ava-author", "editors")


@pytest.fixture
def superuser(db: None) -> User:
    return _user("sam-super", superuser=True)


# --- time and steps ------------------------------------------------------------------------


def event_kinds(task: Task, *wanted: str) -> list[str]:
    """The kinds of ``task``'s history in order (only the ``wanted`` ones, if named): its
    events and the transitions its attempt records hold (``timeline.history``)."""
    kinds = [entry.kind for entry in timeline.history(task.pk)]
    return [kind for kind in kinds if not wanted or kind in wanted]


def backdate(step: Step, seconds: float = 3600) -> None:
    """Move a step's clocks into the past, as if ``seconds`` had gone by."""
    delta = timedelta(seconds=seconds)
    Step.objects.filter(pk=step.pk, available_at__isnull=False).update(
        available_at=F("available_at") - delta
    )
    Step.objects.filter(pk=step.pk, lease_expires_at__isnull=False).update(
        lease_expires_at=F("lease_expires_at") - delta
    )
    Step.objects.filter(pk=step.pk, dispatched_at__isnull=False).update(
        dispatched_at=F("dispatched_at") - delta
    )


def only_step(task: Task) -> Step:
    return task.steps.get()


def worker_thread(target: Callable[[], object], errors: list[BaseException]) -> threading.Thread:
    """A thread, not yet started, that runs ``target`` on its own database connection (as a
    worker process would) and collects what it raises."""

    def work() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    return threading.Thread(target=work)


def together(*actions: Callable[[], Any]) -> list[BaseException]:
    """Run the actions at once, each in a thread with its own connection; their errors."""
    barrier = threading.Barrier(len(actions))
    errors: list[BaseException] = []

    def starting(action: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            barrier.wait()
            action()

        return run

    threads = [worker_thread(starting(action), errors) for action in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "an action is still waiting"
    return errors


# --- a two-step workflow ----------------------------------------------------------------------

PAIR = "test.pair"


def _done(ctx: StepContext) -> dict[str, Any]:
    return {"done": ctx.step_key.split(":")[-1]}


@pytest.fixture
def pair() -> Iterator[str]:
    """Two steps, ``draft`` then ``publish``, each returning ``{"done": <kind>}``."""
    register(Workflow(PAIR, 1, steps=(StepSpec("draft", _done), StepSpec("publish", _done))))
    yield PAIR
    registry.unregister(PAIR, 1)


# --- remote systems -------------------------------------------------------------------------


@pytest.fixture
def remotes(settings: Any) -> Iterator[tuple[LoopbackRemote, LoopbackRemote]]:
    """The publishing and mail remotes on loopback, with a short client timeout."""
    with loopback_remotes() as (publishing, mail):
        settings.PUBLISH_URL = publishing.url
        settings.MAIL_URL = mail.url
        settings.REMOTE_TIMEOUT_SECONDS = 0.5
        yield publishing, mail


@pytest.fixture(scope="module")
def module_remotes() -> Iterator[tuple[LoopbackRemote, LoopbackRemote]]:
    """The remotes a module's worker process calls, on loopback (the worker is told their
    addresses when it starts, so they live as long as the module)."""
    with loopback_remotes() as pair:
        yield pair


# --- the broker -----------------------------------------------------------------------------


class BrokerView:
    """Reads the doorbells waiting in this run's Redis queues (keys under our prefix)."""

    def __init__(self) -> None:
        self.client = redis.Redis.from_url(settings.REDIS_URL)

    def step_ids(self, queue: str = "default") -> list[int]:
        assert publisher.flush(), "doorbells still unpublished after 5 s"
        ids = []
        raws = cast(list[bytes], self.client.lrange(f"{BROKER_PREFIX}{queue}", 0, -1))
        for raw in raws:
            message = json.loads(raw)
            body = json.loads(base64.b64decode(message["body"]))
            args = body[0] if isinstance(body, list) else body.get("args", [])
            ids.append(int(args[0]))
        return sorted(ids)

    def purge(self) -> None:
        """Drop every message, the doorbells still on their way included."""
        assert publisher.flush(), "doorbells still unpublished after 5 s"
        for key in self.client.scan_iter(match=f"{BROKER_PREFIX}*"):
            self.client.delete(key)


@pytest.fixture
def broker() -> Iterator[BrokerView]:
    view = BrokerView()
    view.purge()
    yield view
    view.purge()


@pytest.fixture(scope="session", autouse=True)
def _clean_broker_keys() -> Iterator[None]:
    yield
    if BROKER_PREFIX and getattr(settings, "REDIS_URL", ""):
        BrokerView().purge()


# --- the cache ----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _own_cache_keys(settings: Any) -> None:
    """Each test counts in the cache afresh (each user's reads, the bulk plans applied):
    under a key prefix of its own in this run's Redis, since user ids repeat from test to
    test."""
    default = settings.CACHES["default"]
    prefix = f"{default.get('KEY_PREFIX', '')}:{uuid.uuid4().hex}"
    settings.CACHES = {**settings.CACHES, "default": {**default, "KEY_PREFIX": prefix}}


# --- the history check ------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _history_folds_to_stored_state(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every database test: folding each task's events gives its stored state.

    The database fixture is requested here so that it is torn down after this check.
    """
    marker = request.node.get_closest_marker("django_db")
    transactional = "transactional_db" in request.fixturenames or bool(
        marker and marker.kwargs.get("transaction")
    )
    if transactional:
        request.getfixturevalue("transactional_db")
    elif "db" in request.fixturenames or marker:
        request.getfixturevalue("db")
    else:
        yield
        return
    yield
    if request.node.get_closest_marker("no_fold_check"):
        return
    mismatches = history_mismatches()
    assert not mismatches, f"event history does not fold to the stored state: {mismatches}"


def history_mismatches(task_ids: list[int] | None = None) -> dict[int, dict[str, TaskState]]:
    """The tasks (of ``task_ids``, or every one) whose history, oldest first, does not fold
    to their stored state, with both: what ``fold`` and ``TaskState.from_db`` compare, read
    for all the tasks at once (``timeline.histories``: the events and attempt records)."""
    tasks, steps = Task.objects.all(), Step.objects.all()
    if task_ids is not None:
        tasks = tasks.filter(pk__in=task_ids)
        steps = steps.filter(task_id__in=task_ids)
    # The history first, as ``fold`` reads it before ``from_db`` reads the rows.
    ids = task_ids if task_ids is not None else list(tasks.values_list("pk", flat=True))
    history = {
        pk: [(entry.kind, entry.data) for entry in entries]
        for pk, entries in timeline.histories(ids).items()
    }
    rows = dict(tasks.values_list("pk", "status"))
    task_steps: dict[int, dict[int, StepState]] = {pk: {} for pk in rows}
    columns = ("task_id", "pk", "status", "attempts", "fencing_token")
    for task_id, pk, status, attempts, token in steps.values_list(*columns):
        if task_id in task_steps:
            task_steps[task_id][pk] = StepState(status, attempts, token)
    mismatches = {}
    for pk, status in rows.items():
        state = TaskState.stored(status, task_steps[pk])
        folded = fold_events(history.get(pk, []))
        if folded != state:
            mismatches[pk] = {"folded": folded, "stored": state}
    return mismatches


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> None:
    """The test database is disposable: the flush after a transactional test TRUNCATEs
    every table, the history's too, which PostgreSQL refuses unless the session set
    ``tasks_app.allow_truncate`` (migration 0016). Set here as the test database's default
    for every session opened from now on: the suite's, its threads' and its worker
    processes'. A test that checks the refusal sets it off in its transaction."""
    with django_db_blocker.unblock():
        if connection.vendor != "postgresql":
            return
        if not connection.settings_dict["NAME"].startswith(TEST_DATABASE_PREFIX):
            return  # no test chosen to run needs the database: none was created
        name = connection.ops.quote_name(connection.settings_dict["NAME"])
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER DATABASE {name} SET tasks_app.allow_truncate = 'on'")
            cursor.execute("SET tasks_app.allow_truncate = 'on'")


# What a flush's TRUNCATE can meet from another session: a deadlock, a lock wait past
# lock_timeout.
LOCK_CONFLICTS = {"40P01", "55P03"}
FLUSH_TRIES = 3


def _other_sessions() -> str:
    """The test database's other sessions, one line each: who may have held the locks."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, application_name, state, now() - xact_start, left(query, 160)"
            " FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        rows = cursor.fetchall()
    return "\n".join("  " + " | ".join(str(value) for value in row) for row in rows) or "  none"


@pytest.fixture(scope="session", autouse=True)
def _flush_outlasts_other_sessions() -> Iterator[None]:
    """A transactional test's flush TRUNCATEs every table while a module's worker process
    may still be writing (its counts each second, beat's sweep): the TRUNCATE can deadlock
    with such a transaction, or wait for one past ``lock_timeout``. The flush is tried
    again, up to three times; each conflict prints the other sessions, so a session that
    keeps a lock is named, not hidden."""
    flush: Callable[[TransactionTestCase], None] = TransactionTestCase._fixture_teardown  # type: ignore[attr-defined]

    def flush_again_after_a_conflict(case: TransactionTestCase) -> None:
        for attempt in range(1, FLUSH_TRIES + 1):
            try:
                flush(case)
                return
            except CommandError as exc:
                sqlstate = getattr(getattr(exc.__cause__, "__cause__", None), "sqlstate", None)
                if attempt == FLUSH_TRIES or sqlstate not in LOCK_CONFLICTS:
                    raise
                sys.stderr.write(
                    f"flush try {attempt} met a lock conflict ({sqlstate}: "
                    f"{exc.__cause__}); the database's other sessions:\n{_other_sessions()}\n"
                )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TransactionTestCase, "_fixture_teardown", flush_again_after_a_conflict)
        yield


@pytest.fixture(scope="session", autouse=True)
def _counts_written_when_read() -> None:
    """In this process the counters' writer thread never writes on its own: a test's counts
    are written when it reads them (``counting.totals``), into its own database. Worker
    processes the tests start write theirs as in production."""
    settings.TASKS_COUNTER_FLUSH_MS = 10**9


@pytest.fixture(autouse=True)
def _counts_afresh() -> Iterator[None]:
    """What an earlier test counted and never read is not written into this one's database."""
    counting.discard_unwritten()
    yield
    counting.discard_unwritten()


@pytest.fixture(scope="session", autouse=True)
def _threads_give_connections_back(django_db_setup: None) -> Iterator[None]:
    """The lease keeper keeps its connection while the process lives; before the test
    database is dropped, it gives it back."""
    yield
    from tasks_app.engine.lease_keeper import lease_keeper

    lease_keeper.give_back_connection()


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    """Personas are made per test; the production hasher is deliberately slow."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _private_var_dir(settings: Any, tmp_path: Path) -> None:
    """What a test writes under ``VAR_DIR`` (the demo users' passwords) stays its own."""
    settings.VAR_DIR = tmp_path / "var"
    settings.VAR_DIR.mkdir()
