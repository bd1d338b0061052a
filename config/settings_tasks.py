"""The task system's settings: queues, leases, the sweeper, the remotes of the shipped
workflows, retention and metrics; and Celery's, which config/celery.py reads."""

from __future__ import annotations

import hashlib

from kombu import Queue

from config.env import (
    env_bool,
    env_int,
    env_list,
    env_networks,
    env_str,
    env_url,
    is_fake_remote,
    refuse,
)
from config.settings_django import (
    DATABASE_URL,
    INSTALLED_APPS,
    PRODUCTION,
    REDIS_URL,
    SECRET_KEY,
    VAR_DIR,
)

# --- the task system -------------------------------------------------------------------

TASKS_QUEUES = env_list("TASKS_QUEUES", ["default"])
# Django's own task framework enqueues into this system.
TASKS = {"default": {"BACKEND": "tasks_app.backends.DurableBackend"}}
TASKS_MAINTENANCE_QUEUE = "maintenance"
if TASKS_MAINTENANCE_QUEUE in TASKS_QUEUES:
    refuse("TASKS_QUEUES must not name the reserved queue 'maintenance'")
TASKS_LEASE_SECONDS = env_int("TASKS_LEASE_SECONDS", 30)
TASKS_SWEEP_SECONDS = env_int("TASKS_SWEEP_SECONDS", 5)
# The most tasks one bulk action may change, wherever it is asked for (the console, the
# admin, the commands; tasks_app.operations.operator_actions.bulk_limit). CONSOLE_BULK_LIMIT, its
# name before, is still read.
TASKS_BULK_LIMIT = env_int("TASKS_BULK_LIMIT", env_int("CONSOLE_BULK_LIMIT", 1000))
# A due step whose doorbell may have been lost is re-dispatched at most this often.
TASKS_REDISPATCH_SECONDS = env_int("TASKS_REDISPATCH_SECONDS", 30)
# A worker woken by a doorbell claims due steps in batches of up to this many ...
TASKS_CLAIM_BATCH = env_int("TASKS_CLAIM_BATCH", 50)
# On PostgreSQL the hot paths (batch claims and completions, bulk inserts) run as single
# SQL statements; off, they run the ORM code the embedded SQLite mode runs.
TASKS_SQL_FAST_PATH = env_bool("TASKS_SQL_FAST_PATH", default=True)
# How long a producer (or a worker after a completion) waits for its doorbell to be
# published: by default not at all (the publishing thread sends it); a hung broker holds
# up only that thread, and the sweeper rings later.
TASKS_PUBLISH_WAIT_MS = env_int("TASKS_PUBLISH_WAIT_MS", 0, minimum=0)
# Metrics counters are kept in each process's memory and written this often (one statement
# for all of them), not beside every change they count: a process killed outright loses at
# most its last interval's counts (tasks_app.history.counting).
TASKS_COUNTER_FLUSH_MS = env_int("TASKS_COUNTER_FLUSH_MS", 1000)
# ... for at most this long, then rings for the rest and frees itself.
TASKS_DRAIN_SECONDS = env_int("TASKS_DRAIN_SECONDS", 5)
# A rolling deploy: a step whose workflow version a worker does not have registered is
# handed back to wait for a worker that does, tried again every TASKS_VERSION_RETRY_SECONDS,
# and dead-lettered as incompatible_version once it has waited TASKS_VERSION_WAIT_SECONDS.
TASKS_VERSION_WAIT_SECONDS = env_int("TASKS_VERSION_WAIT_SECONDS", 3600, minimum=0)
TASKS_VERSION_RETRY_SECONDS = env_int("TASKS_VERSION_RETRY_SECONDS", 30)
# Each worker node reports itself this often (tasks_app.engine.presence); one not seen for
# TASKS_WORKER_SILENT_SECONDS (two reports missed, by default) is shown as silent.
TASKS_HEARTBEAT_SECONDS = env_int("TASKS_HEARTBEAT_SECONDS", 10)
TASKS_WORKER_SILENT_SECONDS = env_int("TASKS_WORKER_SILENT_SECONDS", 2 * TASKS_HEARTBEAT_SECONDS)
if TASKS_WORKER_SILENT_SECONDS <= TASKS_HEARTBEAT_SECONDS:
    refuse(
        f"TASKS_WORKER_SILENT_SECONDS must be longer than TASKS_HEARTBEAT_SECONDS "
        f"({TASKS_HEARTBEAT_SECONDS} s), not {TASKS_WORKER_SILENT_SECONDS}"
    )
# Where each worker's pool processes record the claims they hold, so a crash costs only the
# step that crashed (tasks_app.engine.crashes): a directory per worker is made here, and
# made again if something removes it. Default: the temporary directory; choose one nothing
# prunes. While it cannot be made, crash isolation is off and /readyz says so.
TASKS_CLAIMS_DIR = env_str("TASKS_CLAIMS_DIR")
# /readyz fails once the sweeper has not finished a sweep for this long.
TASKS_SWEEPER_SILENT_SECONDS = env_int(
    "TASKS_SWEEPER_SILENT_SECONDS", max(60, 6 * TASKS_SWEEP_SECONDS)
)
# /readyz answers within about this long, whatever the database does.
TASKS_READY_TIMEOUT_SECONDS = env_int("TASKS_READY_TIMEOUT_SECONDS", 2)
# The remotes of publish_article (PUBLISH_URL) and ticket_reply (MAIL_URL), the approvals
# app's workflows. While TASKS_FAKE_REMOTES is on they default to the fakes this app
# serves itself under /fake/ (tasks_app/demo/fakes.py; `make run` sets them for the port it serves
# on); it is on by default only in the embedded demo (no DATABASE_URL, not production).
# Production serves no fakes and needs both remotes, real ones, when those workflows are
# installed: a missing or fake remote would only show as dead letters after a review.
TASKS_FAKE_REMOTES = env_bool("TASKS_FAKE_REMOTES", default=not PRODUCTION and not DATABASE_URL)
PUBLISH_URL = env_url(
    "PUBLISH_URL", "http://127.0.0.1:8000/fake/publish/" if TASKS_FAKE_REMOTES else ""
)
MAIL_URL = env_url("MAIL_URL", "http://127.0.0.1:8000/fake/mail/" if TASKS_FAKE_REMOTES else "")
# Credentials for the remotes, sent as "Authorization: Bearer <token>" when set.
PUBLISH_TOKEN = env_str("PUBLISH_TOKEN")
MAIL_TOKEN = env_str("MAIL_TOKEN")
# The fakes take writes only with this token (derived from the secret key, so the demo's
# web and worker processes agree on it); a logged-in user may read what they applied.
FAKE_REMOTES_TOKEN = (
    hashlib.sha256(f"fake-remotes:{SECRET_KEY}".encode()).hexdigest() if TASKS_FAKE_REMOTES else ""
)
if FAKE_REMOTES_TOKEN:
    if is_fake_remote(PUBLISH_URL) and not PUBLISH_TOKEN:
        PUBLISH_TOKEN = FAKE_REMOTES_TOKEN
    if is_fake_remote(MAIL_URL) and not MAIL_TOKEN:
        MAIL_TOKEN = FAKE_REMOTES_TOKEN
if PRODUCTION:
    if TASKS_FAKE_REMOTES:
        refuse(
            "DJANGO_PRODUCTION is set: TASKS_FAKE_REMOTES must be off "
            "(the fake remotes answer anyone, without a login)"
        )
    if "approvals" in INSTALLED_APPS:
        for _name, _url, _workflow in [
            ("PUBLISH_URL", PUBLISH_URL, "publish_article"),
            ("MAIL_URL", MAIL_URL, "ticket_reply"),
        ]:
            if not _url:
                refuse(
                    f"DJANGO_PRODUCTION is set: {_name} is required (the {_workflow} "
                    "workflow calls it)"
                )
            if is_fake_remote(_url):
                refuse(
                    f"DJANGO_PRODUCTION is set: {_name} points at the demo's fake remote "
                    f"({_url}); the {_workflow} workflow needs the real service"
                )
# Seconds a remote call may take before it counts as timed out.
REMOTE_TIMEOUT_SECONDS = env_int("REMOTE_TIMEOUT_SECONDS", 10)
# Finished tasks (succeeded, cancelled) are pruned, with their steps, leases and events,
# this many days after they finished; until then their idempotency keys stay taken.
RETENTION_DAYS = env_int("RETENTION_DAYS", 30)
# Operator actions (redrives, cancels, decisions, queue switches) outlive their task's
# pruning: their events are pruned this many days after they were recorded.
AUDIT_RETENTION_DAYS = env_int("AUDIT_RETENTION_DAYS", 365)
if AUDIT_RETENTION_DAYS < RETENTION_DAYS:
    refuse(
        f"AUDIT_RETENTION_DAYS ({AUDIT_RETENTION_DAYS}) must not be shorter than "
        f"RETENTION_DAYS ({RETENTION_DAYS})"
    )
# Tasks (or audit events) pruned per transaction: each batch holds its row locks briefly.
RETENTION_BATCH = env_int("RETENTION_BATCH", 500)

# --- metrics -------------------------------------------------------------------------

# /metrics answers a request bearing this token ("Authorization: Bearer <token>"), from any
# address, and once it is set nothing else: a proxy on the web process's own machine makes
# every request look local. Without a token it answers these networks (the client's address
# as tasks_app/addresses.py tells it; "none" for no network).
METRICS_TOKEN = env_str("METRICS_TOKEN")
METRICS_ALLOWED_NETWORKS = env_networks("METRICS_ALLOWED_NETWORKS", ["127.0.0.1/32", "::1/128"])


# --- Celery (read by config/celery.py with namespace CELERY) ----------------------------

# Redis hands a message nobody acknowledged to another worker after this many seconds.
BROKER_VISIBILITY_TIMEOUT = env_int("TASKS_BROKER_VISIBILITY_SECONDS", 3600)
if REDIS_URL:
    # A lease must end before Redis re-delivers the message of the step it covers:
    # otherwise a second worker gets the step while the first still holds it.
    if TASKS_LEASE_SECONDS >= BROKER_VISIBILITY_TIMEOUT:
        refuse(
            f"TASKS_LEASE_SECONDS must be shorter than the broker's visibility timeout "
            f"({BROKER_VISIBILITY_TIMEOUT} s), not {TASKS_LEASE_SECONDS}"
        )
    CELERY_BROKER_URL = REDIS_URL
    # Redis, surviving a broker restart (tasks_app/integrations/broker.py).
    CELERY_BROKER_TRANSPORT = "tasks_app.integrations.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
        "visibility_timeout": BROKER_VISIBILITY_TIMEOUT,
        # Unacknowledged messages are looked at this often (kombu's default is every
        # 100 s), so a short visibility timeout is honoured about when it says.
        "unacked_restore_interval": max(1, min(10, BROKER_VISIBILITY_TIMEOUT // 4)),
        "unacked_restore_throttle": 1,
        "socket_connect_timeout": 2,
        "socket_timeout": 5,
        "max_retries": 1,
    }
    if env_str("TASKS_BROKER_PREFIX"):
        CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] = env_str("TASKS_BROKER_PREFIX")
else:
    _broker_dir = VAR_DIR / "broker"
    # Production without REDIS_URL is refused (settings_django): nothing written for it.
    for _folder in ("queue", "control") if not PRODUCTION else ():
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://localhost//"
    # A message file appears whole (tasks_app/integrations/file_broker.py).
    CELERY_BROKER_TRANSPORT = "tasks_app.integrations.file_broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
# Django's cache, shared through Redis when there is one. Nothing relies on it today:
# failed logins are counted in PostgreSQL (axes' database handler).
CACHES = {
    "default": (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": env_str("TASKS_BROKER_PREFIX") or "console",
        }
        if REDIS_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}

CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_BROKER_CONNECTION_TIMEOUT = 2
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Broker faults a worker rides out (tasks_app/integrations/broker.py): an error answer from Redis
# that the transport does not handle itself (a queue declared on a read-only replica while the
# consumer reconnects, say) makes the consumer reconnect instead of the worker exiting.
CELERY_BROKER_CHANNEL_ERROR_RETRY = True
# Each worker node with a free pool process rings for a step of its queues that has been
# due this long with no doorbell, this often (tasks_app/engine/backstop.py; 0: never).
# The demo's schedules (tasks_app.demo.schedules) are declared in the embedded mode that
# `make run` uses, and nowhere else unless this says so.
TASKS_DEMO_SCHEDULES = env_bool("TASKS_DEMO_SCHEDULES", not DATABASE_URL)
TASKS_BACKSTOP_SECONDS = env_int("TASKS_BACKSTOP_SECONDS", 5, minimum=0)
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TIMEZONE = "UTC"
# Celery's Django fixup closes the database connection around every task unless this is
# set; a worker then pays a new connection (and loses its prepared statements) per message.
# Connections are instead checked before each task the way Django does per request
# (config/celery.py): closed when broken or older than CONN_MAX_AGE.
CELERY_DB_REUSE_MAX = 1_000_000
# A worker started without -Q consumes every queue here, the maintenance queue included.
CELERY_TASK_QUEUES = [Queue(name) for name in [*TASKS_QUEUES, TASKS_MAINTENANCE_QUEUE]]
CELERY_TASK_DEFAULT_QUEUE = TASKS_QUEUES[0]
CELERY_TASK_ROUTES = {"tasks_app.tasks.sweep": {"queue": TASKS_MAINTENANCE_QUEUE}}
CELERY_BEAT_SCHEDULE = {
    "sweep": {
        "task": "tasks_app.tasks.sweep",
        "schedule": float(TASKS_SWEEP_SECONDS),
        # A sweep nobody ran in time is replaced by the next one, not queued behind it.
        "options": {"queue": TASKS_MAINTENANCE_QUEUE, "expires": float(TASKS_SWEEP_SECONDS)},
    }
}
# Beat's schedule file (when each entry last ran), the deployment's own: under its var
# folder unless TASKS_BEAT_SCHEDULE_FILE names another, never a path every deployment on a
# host would share (a second beat reading it would delay or repeat the first's sweeps).
# The scheduler makes its folder, which the settings make only in the embedded mode.
CELERY_BEAT_SCHEDULER = "tasks_app.integrations.beat:Scheduler"
CELERY_BEAT_SCHEDULE_FILENAME = env_str("TASKS_BEAT_SCHEDULE_FILE") or str(
    VAR_DIR / "celerybeat-schedule"
)
