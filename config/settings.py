"""One settings module, read from the environment.

With nothing set it runs on the embedded default: SQLite and Celery's file-system broker
under ``var/``. ``DATABASE_URL`` and ``REDIS_URL`` switch to PostgreSQL and Redis.
``DJANGO_PRODUCTION`` refuses to start without a secret key, allowed hosts, PostgreSQL and
Redis, and the real remotes of the shipped workflows.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP
from kombu import Queue

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def env_bool(name: str, default: bool = False) -> bool:
    raw = env_str(name)
    if not raw:
        return default
    lowered = raw.lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), not {raw!r}")


def env_int(name: str, default: int, *, minimum: int = 1) -> int:
    raw = env_str(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {value}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = env_str(name)
    if not raw:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_networks(
    name: str, default: list[str]
) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Comma-separated networks (``10.0.0.0/8``); ``none`` for none."""
    raw = env_list(name, default)
    try:
        return [ipaddress.ip_network(network) for network in raw if network != "none"]
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"{name} must be comma-separated networks (10.0.0.0/8), not {', '.join(raw)!r}: {exc}"
        ) from None


def env_url(name: str, default: str = "") -> str:
    raw = env_str(name)
    if not raw:
        return default
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ImproperlyConfigured(f"{name} must be an http(s) URL with a host, not {raw!r}")
    return raw


def is_fake_remote(url: str) -> bool:
    """Whether ``url`` names one of the fakes served under /fake/, on whichever host."""
    path = urlsplit(url).path
    return path == "/fake" or path.startswith("/fake/")


# The Procfile's processes run in production mode unless told otherwise
# (DJANGO_PRODUCTION=0); `make run` and the tests run without it.
PRODUCTION = env_bool("DJANGO_PRODUCTION")
DEBUG = env_bool("DJANGO_DEBUG", default=not PRODUCTION)
SECRET_KEY = env_str("DJANGO_SECRET_KEY")
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", [] if PRODUCTION else ["localhost", "127.0.0.1"])
if PRODUCTION:
    if not SECRET_KEY:
        raise ImproperlyConfigured("DJANGO_PRODUCTION is set: DJANGO_SECRET_KEY is required")
    if not ALLOWED_HOSTS:
        raise ImproperlyConfigured("DJANGO_PRODUCTION is set: DJANGO_ALLOWED_HOSTS is required")
    if DEBUG:
        raise ImproperlyConfigured(
            "DJANGO_PRODUCTION is set: DJANGO_DEBUG must be off (debug pages show settings "
            "and stack frames to anyone)"
        )
elif not SECRET_KEY:
    SECRET_KEY = "insecure-development-key-not-for-production"  # noqa: S105

# Everything the embedded mode writes (the SQLite file, the broker's folders) lives here,
# and beat's schedule file unless beat is given another. The folder is made only for the
# embedded database or broker, so a PostgreSQL and Redis deployment never writes next to
# its code; beat makes it for its schedule when it starts (config/beat.py).
VAR_DIR = Path(env_str("TASKS_VAR_DIR") or BASE_DIR / "var")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "axes",
    "django_htmx",
    "tasks_app",
    "approvals",
    "console",
]

MIDDLEWARE = [
    # X-Forwarded-Proto believed only from TRUSTED_PROXY_NETWORKS, before anything asks
    # whether a request came over TLS.
    "config.addresses.ForwardedProtoMiddleware",
    # /healthz and /readyz, before the host check and the HTTPS redirect.
    "config.probes.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Every answer past the static files is dynamic: Cache-Control no-store.
    "console.middleware.NoStoreMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Every page needs a logged-in user; the login page and the fakes opt out.
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # A refused or missing object answers with the console's page, DEBUG or not.
    "console.errors.RefusalMiddleware",
    # Last, as axes asks: turns a login refused for a lockout into its answer.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.csp",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context.section",
                "console.context.approvals_waiting",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL")
REDIS_URL = env_str("REDIS_URL")
if PRODUCTION:
    # Without them a process would quietly run on the embedded demo's SQLite file and file
    # broker under var/: work that no other machine sees and that goes with the disk.
    for _name, _value, _embedded in [
        ("DATABASE_URL", DATABASE_URL, "the embedded SQLite database"),
        ("REDIS_URL", REDIS_URL, "the embedded file-system broker"),
    ]:
        if not _value:
            raise ImproperlyConfigured(
                f"DJANGO_PRODUCTION is set: {_name} is required (without it this process "
                f"would use {_embedded} under var/, which no other process shares)"
            )
# Every PostgreSQL session of every process (web, workers, the sweeper, beat, producers
# using the service API) waits this long at most: to connect; for one statement (0: no
# limit, as the release step's migrations run); for a row lock; idle inside a
# transaction. A hung server, which enforces nothing, is bounded on the client side:
# a statement still unanswered STATEMENT_TIMEOUT + TASKS_DB_CLIENT_GRACE_SECONDS after
# it was sent has its connection cut (tasks_app.deadlines, tasks_app.pg_backend).
# (libpq's shortest connect timeout is 2 s; /readyz answers within about that.)
TASKS_DB_CONNECT_TIMEOUT_SECONDS = env_int("TASKS_DB_CONNECT_TIMEOUT_SECONDS", 2)
TASKS_DB_STATEMENT_TIMEOUT_MS = env_int("TASKS_DB_STATEMENT_TIMEOUT_MS", 30_000, minimum=0)
TASKS_DB_LOCK_TIMEOUT_MS = env_int("TASKS_DB_LOCK_TIMEOUT_MS", 10_000, minimum=0)
TASKS_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS = env_int(
    "TASKS_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", 60_000, minimum=0
)
TASKS_DB_CLIENT_GRACE_SECONDS = env_int("TASKS_DB_CLIENT_GRACE_SECONDS", 5)
# A connection is kept this long (CONN_MAX_AGE), and a worker process idle this long gives
# its connections back (tasks_app.idle_connections).
TASKS_DB_CONN_MAX_AGE_SECONDS = env_int("TASKS_DB_CONN_MAX_AGE_SECONDS", 60, minimum=0)
# A migration's DDL waits at most this long for a table's lock (shorter than the workers'
# own, so nobody queued behind it gives up), and a statement outside a transaction whose
# wait ran out is tried again up to this many times (tasks_app.pg_backend.schema).
TASKS_MIGRATION_LOCK_TIMEOUT_MS = env_int("TASKS_MIGRATION_LOCK_TIMEOUT_MS", 2_000)
TASKS_MIGRATION_LOCK_ATTEMPTS = env_int("TASKS_MIGRATION_LOCK_ATTEMPTS", 10)
# The sweeper waits at most this long for a row it cannot skip (tasks_app.lock_conflicts).
TASKS_SWEEPER_LOCK_TIMEOUT_MS = env_int("TASKS_SWEEPER_LOCK_TIMEOUT_MS", 1_000)
if DATABASE_URL:
    DATABASES = {
        "default": dj_database_url.parse(DATABASE_URL, conn_max_age=TASKS_DB_CONN_MAX_AGE_SECONDS)
    }
    if PRODUCTION and DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        # The database's clock, the event history's append-only trigger and the hot
        # statements are PostgreSQL's; SQLite is the embedded demo's.
        raise ImproperlyConfigured(
            "DJANGO_PRODUCTION is set: DATABASE_URL must name a PostgreSQL database "
            f"(postgres://…), not {DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}"
        )
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # Django's backend, every round trip bounded on the client side as well.
        DATABASES["default"]["ENGINE"] = "tasks_app.pg_backend"
        _options = DATABASES["default"].setdefault("OPTIONS", {})
        # Django's own cursors bind client-side and never prepare; this lets the task
        # system's hot statements (tasks_app/batch.py) be prepared once per connection.
        # Behind PgBouncer, use session pooling or its prepared-statement support.
        _options["prepare_threshold"] = 5
        _options.setdefault("connect_timeout", TASKS_DB_CONNECT_TIMEOUT_SECONDS)
        # A peer that vanished (host gone, network cut) is noticed in about a minute.
        _options.update(keepalives=1, keepalives_idle=30, keepalives_interval=10)
        _options["options"] = " ".join(
            [
                str(_options.get("options", "")),
                f"-c statement_timeout={TASKS_DB_STATEMENT_TIMEOUT_MS}",
                f"-c lock_timeout={TASKS_DB_LOCK_TIMEOUT_MS}",
                f"-c idle_in_transaction_session_timeout={TASKS_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS}",
            ]
        ).strip()
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(VAR_DIR / "db.sqlite3"),
            "OPTIONS": {
                # WAL lets the web process read while a worker writes; IMMEDIATE takes the
                # write lock at BEGIN, so two writers queue on busy_timeout instead of
                # failing with "database is locked" half-way through a transaction.
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
DATABASES["default"].setdefault("TEST", {})
# SQLite ignores an index's included columns (task_active_status_idx carries the workflow
# for the metrics on PostgreSQL); the embedded mode does without, and says nothing.
SILENCED_SYSTEM_CHECKS = (
    ["models.W040"] if DATABASES["default"]["ENGINE"].endswith("sqlite3") else []
)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Where `collectstatic` (the Procfile's release line) puts the files production serves.
STATIC_ROOT = Path(env_str("DJANGO_STATIC_ROOT") or BASE_DIR / "staticfiles")
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if PRODUCTION
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}

# Outside production static files are served from the finders; production serves the
# collected, hashed files from STATIC_ROOT.
WHITENOISE_AUTOREFRESH = not PRODUCTION
WHITENOISE_USE_FINDERS = not PRODUCTION

LOGIN_URL = "login"
# Editors land on the approvals waiting for them, everyone else on the overview.
LOGIN_REDIRECT_URL = "console:start"
LOGOUT_REDIRECT_URL = "login"

# Scripts run only from our own origin with this response's nonce: no inline handlers, no
# eval (htmx is configured to need neither), no inline styles.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "font-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.SELF],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}

# Celery logs two lines per message at INFO (received, succeeded), one per message a worker
# discards unrun (a sweep that expired in the queue), and beat one per message it
# schedules (the sweep, every TASKS_SWEEP_SECONDS). A worker drains many steps per message
# and logs one line per drain instead (tasks_app.runner), and one summing up what it
# discarded (config.celery); on, Celery's and beat's lines come back, for following single
# messages.
TASKS_LOG_MESSAGES = env_bool("TASKS_LOG_MESSAGES")
# Every line readable (`text`) or one JSON object per line (`json`), for all loggers; the
# task system's operational lines (tasks_app.oplog) carry their fields either way.
TASKS_LOG_FORMATS = ("text", "json")
TASKS_LOG_FORMAT = env_str("TASKS_LOG_FORMAT", "text").lower()
if TASKS_LOG_FORMAT not in TASKS_LOG_FORMATS:
    raise ImproperlyConfigured(
        f"TASKS_LOG_FORMAT must be one of {', '.join(TASKS_LOG_FORMATS)}, "
        f"not {env_str('TASKS_LOG_FORMAT')!r}"
    )
_quiet = {} if TASKS_LOG_MESSAGES else {"level": "WARNING"}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "config.logs.JsonFormatter"},
    },
    "filters": {
        "beat_sends": {"()": "config.logs.DropBeatSends"},
        "discards": {"()": "config.logs.DropDiscards"},
        "probes": {"()": "config.logs.DropProbeAnswers"},
        "crashes": {"()": "config.logs.OneLinePerCrash"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": TASKS_LOG_FORMAT,
            # Sees every logger's records, so it can tell one crash's lines apart.
            "filters": ["crashes"],
        }
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        # Django's own loggers write through the one handler too (its defaults add a
        # handler of their own, which outside production wrote each line a second time).
        "django": {"level": "INFO"},
        "django.server": {"handlers": ["console"], "level": "INFO", "propagate": False},
        # A probe's answer is for its prober: no ERROR line per 503 of /readyz (the probe
        # logs a change of readiness once, config.probes).
        "django.request": {"filters": ["probes"]},
        "config": {"level": "INFO"},
        "tasks_app": {"level": env_str("TASKS_LOG_LEVEL", "INFO")},
        "celery.app.trace": _quiet,
        "celery.worker.strategy": _quiet,
        # A message that expired in the queue (a sweep while no maintenance worker ran) is
        # discarded with a line each; the worker sums them up instead (config.celery).
        "celery.worker.request": {} if TASKS_LOG_MESSAGES else {"filters": ["discards"]},
        # Billiard's (the prefork pool's) lines, which Celery would give a handler and
        # format of its own: through the one handler, in the one format.
        "multiprocessing": {"handlers": ["console"], "propagate": False},
        # Beat's start-up line comes from the same logger and stays; config.beat says when
        # beat stops.
        "celery.beat": {} if TASKS_LOG_MESSAGES else {"filters": ["beat_sends"]},
    },
}

if PRODUCTION:
    # A request came over TLS when the proxy that ended it says so; the header is read only
    # from the proxies named in DJANGO_TRUSTED_PROXIES and dropped from anyone else
    # (config.addresses.ForwardedProtoMiddleware), so a client that reaches a web process
    # directly cannot claim HTTPS. gunicorn believes no forwarded header itself (the
    # Procfile's --forwarded-allow-ips '').
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SSL_REDIRECT", default=True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_CONTENT_TYPE_NOSNIFF = True

# Proxies whose X-Forwarded-For and X-Forwarded-Proto are believed (comma-separated
# networks; none by default, so a client's address is always the connecting one and no
# request is taken for HTTPS on a header's word: config/addresses.py). Behind a proxy,
# name its addresses; unset, every client has the proxy's address, and production
# redirects every request the proxy forwards to HTTPS again.
TRUSTED_PROXY_NETWORKS = env_networks("DJANGO_TRUSTED_PROXIES", [])

# --- the task system -------------------------------------------------------------------

TASKS_QUEUES = env_list("TASKS_QUEUES", ["default"])
# Django's own task framework enqueues into this system.
TASKS = {"default": {"BACKEND": "tasks_app.backends.DurableBackend"}}
TASKS_MAINTENANCE_QUEUE = "maintenance"
if TASKS_MAINTENANCE_QUEUE in TASKS_QUEUES:
    raise ImproperlyConfigured("TASKS_QUEUES must not name the reserved queue 'maintenance'")
TASKS_LEASE_SECONDS = env_int("TASKS_LEASE_SECONDS", 30)
TASKS_SWEEP_SECONDS = env_int("TASKS_SWEEP_SECONDS", 5)
# A due step whose doorbell may have been lost is re-dispatched at most this often.
TASKS_REDISPATCH_SECONDS = env_int("TASKS_REDISPATCH_SECONDS", 30)
# A worker woken by a doorbell claims due steps in batches of up to this many ...
TASKS_CLAIM_BATCH = env_int("TASKS_CLAIM_BATCH", 50)
# On PostgreSQL the hot paths (batch claims and completions, bulk inserts) run as single
# SQL statements; off, they run the ORM code the embedded SQLite mode runs.
TASKS_SQL_FAST_PATH = env_bool("TASKS_SQL_FAST_PATH", default=True)
# The longest a producer (or a worker after a completion) waits for its doorbell to be
# published; a hung broker holds up only the publishing thread, the sweeper rings later.
TASKS_PUBLISH_WAIT_MS = env_int("TASKS_PUBLISH_WAIT_MS", 250, minimum=0)
# ... for at most this long, then rings for the rest and frees itself.
TASKS_DRAIN_SECONDS = env_int("TASKS_DRAIN_SECONDS", 5)
# A rolling deploy: a step whose workflow version a worker does not have registered is
# handed back to wait for a worker that does, tried again every TASKS_VERSION_RETRY_SECONDS,
# and dead-lettered as incompatible_version once it has waited TASKS_VERSION_WAIT_SECONDS.
TASKS_VERSION_WAIT_SECONDS = env_int("TASKS_VERSION_WAIT_SECONDS", 3600, minimum=0)
TASKS_VERSION_RETRY_SECONDS = env_int("TASKS_VERSION_RETRY_SECONDS", 30)
# Each worker node reports itself this often (tasks_app.presence); one not seen for
# TASKS_WORKER_SILENT_SECONDS (two reports missed, by default) is shown as silent.
TASKS_HEARTBEAT_SECONDS = env_int("TASKS_HEARTBEAT_SECONDS", 10)
TASKS_WORKER_SILENT_SECONDS = env_int("TASKS_WORKER_SILENT_SECONDS", 2 * TASKS_HEARTBEAT_SECONDS)
if TASKS_WORKER_SILENT_SECONDS <= TASKS_HEARTBEAT_SECONDS:
    raise ImproperlyConfigured(
        f"TASKS_WORKER_SILENT_SECONDS must be longer than TASKS_HEARTBEAT_SECONDS "
        f"({TASKS_HEARTBEAT_SECONDS} s), not {TASKS_WORKER_SILENT_SECONDS}"
    )
# /readyz fails once the sweeper has not finished a sweep for this long.
TASKS_SWEEPER_SILENT_SECONDS = env_int(
    "TASKS_SWEEPER_SILENT_SECONDS", max(60, 6 * TASKS_SWEEP_SECONDS)
)
# /readyz answers within about this long, whatever the database does.
TASKS_READY_TIMEOUT_SECONDS = env_int("TASKS_READY_TIMEOUT_SECONDS", 2)
# The remotes of publish_article (PUBLISH_URL) and ticket_reply (MAIL_URL), the approvals
# app's workflows. While TASKS_FAKE_REMOTES is on they default to the fakes this app
# serves itself under /fake/ (config/fakes.py; `make run` sets them for the port it serves
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
        raise ImproperlyConfigured(
            "DJANGO_PRODUCTION is set: TASKS_FAKE_REMOTES must be off "
            "(the fake remotes answer anyone, without a login)"
        )
    if "approvals" in INSTALLED_APPS:
        for _name, _url, _workflow in [
            ("PUBLISH_URL", PUBLISH_URL, "publish_article"),
            ("MAIL_URL", MAIL_URL, "ticket_reply"),
        ]:
            if not _url:
                raise ImproperlyConfigured(
                    f"DJANGO_PRODUCTION is set: {_name} is required (the {_workflow} "
                    "workflow calls it)"
                )
            if is_fake_remote(_url):
                raise ImproperlyConfigured(
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
    raise ImproperlyConfigured(
        f"AUDIT_RETENTION_DAYS ({AUDIT_RETENTION_DAYS}) must not be shorter than "
        f"RETENTION_DAYS ({RETENTION_DAYS})"
    )
# Tasks (or audit events) pruned per transaction: each batch holds its row locks briefly.
RETENTION_BATCH = env_int("RETENTION_BATCH", 500)

# --- metrics -------------------------------------------------------------------------

# /metrics answers a request bearing this token ("Authorization: Bearer <token>"), from any
# address, and once it is set nothing else: a proxy on the web process's own machine makes
# every request look local. Without a token it answers these networks (the client's address
# as config/addresses.py tells it; "none" for no network).
METRICS_TOKEN = env_str("METRICS_TOKEN")
METRICS_ALLOWED_NETWORKS = env_networks("METRICS_ALLOWED_NETWORKS", ["127.0.0.1/32", "::1/128"])

# --- the console ---------------------------------------------------------------------

# Secrets never leave in clear (the console, the admin, the audit CSV, the log): the value
# of a key whose name contains one of these, compared case-insensitively with "-", "_" and
# spaces ignored, at any depth, and in free text after "key=" or "key:" (tasks_app.redaction).
REDACT_KEY_PATTERNS = env_list(
    "REDACT_KEY_PATTERNS",
    [
        "token",
        "secret",
        "password",
        "passwd",
        "api_key",
        "apikey",
        "authorization",
        "cookie",
        "session",
        "private_key",
        "credential",
    ],
)
# The exact key lists this replaced (the console's and the log's) are still read, as more
# patterns: a deployment that set them hides at least what it hid before.
REDACT_KEY_PATTERNS += [
    key
    for name in ("CONSOLE_REDACT_KEYS", "TASKS_LOG_REDACT_KEYS")
    for key in env_list(name, [])
    if key not in REDACT_KEY_PATTERNS
]
# The most tasks one bulk action on dead letters may change.
CONSOLE_BULK_LIMIT = env_int("CONSOLE_BULK_LIMIT", 1000)
# How long a bulk action's preview (its plan) may be confirmed.
CONSOLE_BULK_PLAN_SECONDS = env_int("CONSOLE_BULK_PLAN_SECONDS", 900)
CONSOLE_PAGE_SIZE = env_int("CONSOLE_PAGE_SIZE", 50)

# --- logins (django-axes) ----------------------------------------------------------------

# Every login, the console's and the admin's, goes through axes' backend: after
# CONSOLE_LOGIN_ATTEMPTS failures of one username from one address, that pair is refused
# (even the right password) for CONSOLE_LOGIN_WINDOW_SECONDS after the last counted
# failure. The pair, not either alone: a stranger elsewhere cannot lock a user out, and one
# address (a shared office) cannot lock out its neighbours. Counted in the database, so it
# neither depends on Redis nor forgets on a restart. Unlock: `manage.py
# axes_reset_username USERNAME` (README, Logins).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_FAILURE_LIMIT = env_int("CONSOLE_LOGIN_ATTEMPTS", 5)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("CONSOLE_LOGIN_WINDOW_SECONDS", 900))
# Tries while locked out are refused without being counted, so the lockout ends when it
# said it would; a successful login clears that pair's count.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_RESET_ON_SUCCESS = True
# The address is the client's as config/addresses.py decides it: X-Forwarded-For only
# from TRUSTED_PROXY_NETWORKS.
AXES_CLIENT_IP_CALLABLE = "config.addresses.client_address"
# The refused login page itself (its form says why), with axes' status (429).
AXES_LOCKOUT_CALLABLE = "console.logins.lockout_response"
AXES_HTTP_RESPONSE_CODE = 429
# No table of every successful login: nothing would prune it.
AXES_DISABLE_ACCESS_LOG = True

# --- Celery (read by config/celery.py with namespace CELERY) ----------------------------

# Redis hands a message nobody acknowledged to another worker after this many seconds.
BROKER_VISIBILITY_TIMEOUT = env_int("TASKS_BROKER_VISIBILITY_SECONDS", 3600)
if REDIS_URL:
    # A lease must end before Redis re-delivers the message of the step it covers:
    # otherwise a second worker gets the step while the first still holds it.
    if TASKS_LEASE_SECONDS >= BROKER_VISIBILITY_TIMEOUT:
        raise ImproperlyConfigured(
            f"TASKS_LEASE_SECONDS must be shorter than the broker's visibility timeout "
            f"({BROKER_VISIBILITY_TIMEOUT} s), not {TASKS_LEASE_SECONDS}"
        )
    CELERY_BROKER_URL = REDIS_URL
    # Redis, surviving a broker restart (config/broker.py).
    CELERY_BROKER_TRANSPORT = "config.broker:Transport"
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
    for _folder in ("queue", "control"):
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://localhost//"
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
# Broker faults a worker rides out (config/broker.py): an error answer from Redis that the
# transport does not handle itself (a queue declared on a read-only replica while the
# consumer reconnects, say) makes the consumer reconnect instead of the worker exiting.
CELERY_BROKER_CHANNEL_ERROR_RETRY = True
# Each worker node with a free pool process rings for a step of its queues that has been
# due this long with no doorbell, this often (tasks_app/backstop.py; 0: never).
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
# Beat's schedule file, unless beat is started with --schedule (Procfile's is in /tmp); the
# scheduler makes its folder, which the settings make only in the embedded mode.
CELERY_BEAT_SCHEDULER = "config.beat:Scheduler"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
