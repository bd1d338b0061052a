"""Django's own settings: production mode and its refusals, apps, middleware, templates,
the database and its timeouts, static files, security headers and logging."""

from __future__ import annotations

from pathlib import Path

import dj_database_url
from django.utils.csp import CSP

from config.env import (
    BASE_DIR,
    env_bool,
    env_int,
    env_list,
    env_networks,
    env_str,
    refuse,
)

# The Procfile's processes run in production mode unless told otherwise
# (DJANGO_PRODUCTION=0); `make run` and the tests run without it.
PRODUCTION = env_bool("DJANGO_PRODUCTION")
DEBUG = env_bool("DJANGO_DEBUG", default=not PRODUCTION)
SECRET_KEY = env_str("DJANGO_SECRET_KEY")
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", [] if PRODUCTION else ["localhost", "127.0.0.1"])
if PRODUCTION:
    if not SECRET_KEY:
        refuse("DJANGO_PRODUCTION is set: DJANGO_SECRET_KEY is required")
    if not ALLOWED_HOSTS:
        refuse("DJANGO_PRODUCTION is set: DJANGO_ALLOWED_HOSTS is required")
    if DEBUG:
        refuse(
            "DJANGO_PRODUCTION is set: DJANGO_DEBUG must be off (debug pages show settings "
            "and stack frames to anyone)"
        )
elif not SECRET_KEY:
    SECRET_KEY = "insecure-development-key-not-for-production"  # noqa: S105

# Everything the embedded mode writes (the SQLite file, the broker's folders) lives here,
# and beat's schedule file unless beat is given another. The folder is made only for the
# embedded database or broker, so a PostgreSQL and Redis deployment never writes next to
# its code; beat makes it for its schedule when it starts (tasks_app/integrations/beat.py).
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
    # Its Swagger page's scripts and styles, served from here rather than a CDN.
    "ninja",
    "tasks_app",
    "approvals",
    "console",
    "api",
]

MIDDLEWARE = [
    # X-Forwarded-Proto believed only from TRUSTED_PROXY_NETWORKS, before anything asks
    # whether a request came over TLS.
    "tasks_app.addresses.ForwardedProtoMiddleware",
    # /healthz and /readyz, before the host check and the HTTPS redirect.
    "tasks_app.observability.probes.ProbeMiddleware",
    # Every statement of a request under the web's short deadline (TASKS_WEB_STATEMENT_TIMEOUT_MS).
    "tasks_app.db.deadlines.WebDeadlineMiddleware",
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
    # Each user's reads a minute, limited (CONSOLE_READS_PER_MINUTE): after the user and
    # htmx are known, before any view reads the database.
    "console.throttle.ReadLimitMiddleware",
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
                "console.context.plans_waiting",
                "console.context.demo_mail",
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
            refuse(
                f"DJANGO_PRODUCTION is set: {_name} is required (without it this process "
                f"would use {_embedded} under var/, which no other process shares)"
            )
# Every PostgreSQL session of every process (web, workers, the sweeper, beat, producers
# using the service API) waits this long at most: to connect; for one statement (0: no
# limit, as the release step's migrations run); for a row lock; idle inside a
# transaction. A hung server, which enforces nothing, is bounded on the client side:
# a statement still unanswered STATEMENT_TIMEOUT + TASKS_DB_CLIENT_GRACE_SECONDS after
# it was sent has its connection cut (tasks_app.db.deadlines, tasks_app.db.pg_backend).
# (libpq's shortest connect timeout is 2 s; /readyz answers within about that.)
TASKS_DB_CONNECT_TIMEOUT_SECONDS = env_int("TASKS_DB_CONNECT_TIMEOUT_SECONDS", 2)
TASKS_DB_STATEMENT_TIMEOUT_MS = env_int("TASKS_DB_STATEMENT_TIMEOUT_MS", 30_000, minimum=0)
TASKS_DB_LOCK_TIMEOUT_MS = env_int("TASKS_DB_LOCK_TIMEOUT_MS", 10_000, minimum=0)
TASKS_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS = env_int(
    "TASKS_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", 60_000, minimum=0
)
TASKS_DB_CLIENT_GRACE_SECONDS = env_int("TASKS_DB_CLIENT_GRACE_SECONDS", 5)
# A web request's statements wait this long at most (0: as every session), and are cut on
# the client side this plus the grace after they were sent: a hung or locked database
# answers a page 503 in seconds and frees its thread (tasks_app.db.deadlines).
TASKS_WEB_STATEMENT_TIMEOUT_MS = env_int("TASKS_WEB_STATEMENT_TIMEOUT_MS", 5_000, minimum=0)
# A connection is kept this long (CONN_MAX_AGE), and a worker process idle this long gives
# its connections back (tasks_app.db.idle_connections).
TASKS_DB_CONN_MAX_AGE_SECONDS = env_int("TASKS_DB_CONN_MAX_AGE_SECONDS", 60, minimum=0)
# A migration's DDL waits at most this long for a table's lock (shorter than the workers'
# own, so nobody queued behind it gives up), and a statement outside a transaction whose
# wait ran out is tried again up to this many times (tasks_app.db.pg_backend.schema).
TASKS_MIGRATION_LOCK_TIMEOUT_MS = env_int("TASKS_MIGRATION_LOCK_TIMEOUT_MS", 2_000)
TASKS_MIGRATION_LOCK_ATTEMPTS = env_int("TASKS_MIGRATION_LOCK_ATTEMPTS", 10)
# The sweeper waits at most this long for a row it cannot skip (tasks_app.db.lock_conflicts).
TASKS_SWEEPER_LOCK_TIMEOUT_MS = env_int("TASKS_SWEEPER_LOCK_TIMEOUT_MS", 1_000)
if DATABASE_URL:
    DATABASES = {
        # A kept connection is tried (SELECT 1, bounded) before its first use in each
        # request or task: one the server dropped (a restart, a failover) is replaced
        # there instead of failing the request.
        "default": dj_database_url.parse(
            DATABASE_URL, conn_max_age=TASKS_DB_CONN_MAX_AGE_SECONDS, conn_health_checks=True
        )
    }
    if PRODUCTION and DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        # The database's clock, the event history's append-only trigger and the hot
        # statements are PostgreSQL's; SQLite is the embedded demo's.
        refuse(
            "DJANGO_PRODUCTION is set: DATABASE_URL must name a PostgreSQL database "
            f"(postgres://…), not {DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}"
        )
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # Django's backend, every round trip bounded on the client side as well.
        DATABASES["default"]["ENGINE"] = "tasks_app.db.pg_backend"
        _options = DATABASES["default"].setdefault("OPTIONS", {})
        # Django's own cursors bind client-side and never prepare; this lets the task
        # system's hot statements (tasks_app/engine/fastpath.py) be prepared once per connection.
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
    # Production without DATABASE_URL is refused above: it stops before writing anything.
    if not PRODUCTION:
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
# and logs one line per drain instead (tasks_app.engine.runner), and one summing up what it
# discarded (config.celery); on, Celery's and beat's lines come back, for following single
# messages.
TASKS_LOG_MESSAGES = env_bool("TASKS_LOG_MESSAGES")
# Every line readable (`text`) or one JSON object per line (`json`), for all loggers; the
# task system's operational lines (tasks_app.observability.oplog) carry their fields either way.
TASKS_LOG_FORMATS = ("text", "json")
TASKS_LOG_FORMAT = env_str("TASKS_LOG_FORMAT", "text").lower()
if TASKS_LOG_FORMAT not in TASKS_LOG_FORMATS:
    refuse(
        f"TASKS_LOG_FORMAT must be one of {', '.join(TASKS_LOG_FORMATS)}, "
        f"not {env_str('TASKS_LOG_FORMAT')!r}"
    )
    TASKS_LOG_FORMAT = "text"
_quiet = {} if TASKS_LOG_MESSAGES else {"level": "WARNING"}
# dictConfig, and Python's warnings written as lines of this log.
LOGGING_CONFIG = "tasks_app.observability.logs.configure"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "tasks_app.observability.logs.JsonFormatter"},
    },
    "filters": {
        "beat_sends": {"()": "tasks_app.observability.logs.DropBeatSends"},
        "discards": {"()": "tasks_app.observability.logs.DropDiscards"},
        "probes": {"()": "tasks_app.observability.logs.DropProbeAnswers"},
        "crashes": {"()": "tasks_app.observability.logs.OneLinePerCrash"},
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
        # logs a change of readiness once, tasks_app.observability.probes).
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
        # Beat's start-up line comes from the same logger and stays; tasks_app.integrations.beat
        # says when beat stops.
        "celery.beat": {} if TASKS_LOG_MESSAGES else {"filters": ["beat_sends"]},
    },
}

if PRODUCTION:
    # A request came over TLS when the proxy that ended it says so; the header is read only
    # from the proxies named in DJANGO_TRUSTED_PROXIES and dropped from anyone else
    # (tasks_app.addresses.ForwardedProtoMiddleware), so a client that reaches a
    # web process directly cannot claim HTTPS. gunicorn believes no forwarded header itself (the
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
# request is taken for HTTPS on a header's word: tasks_app/addresses.py).
# Behind a proxy,
# name its addresses; unset, every client has the proxy's address, and production
# redirects every request the proxy forwards to HTTPS again.
TRUSTED_PROXY_NETWORKS = env_networks("DJANGO_TRUSTED_PROXIES", [])
