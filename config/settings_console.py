"""The console's settings: redaction, bulk plans and pages, the approvals' mail, and logins
(django-axes)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from config.env import (
    env_bool,
    env_int,
    env_list,
    env_str,
    env_url,
)
from config.settings_django import PRODUCTION, VAR_DIR

# --- the console ---------------------------------------------------------------------

# Secrets never leave in clear (the console, the admin, the audit CSV, the log): the value of a key
# whose name contains one of these, compared case-insensitively with "-", "_" and spaces ignored, at
# any depth, and in free text after "key=" or "key:" (tasks_app.redaction).
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
# How long a bulk action's preview (its plan) may be confirmed.
CONSOLE_BULK_PLAN_SECONDS = env_int("CONSOLE_BULK_PLAN_SECONDS", 900)
CONSOLE_PAGE_SIZE = env_int("CONSOLE_PAGE_SIZE", 50)
# Each user's reads (pages, htmx regions, the admin's pages) a minute, counted in the cache;
# past it, 429 with Retry-After until the minute ends (console/throttle.py). 0: no limit.
CONSOLE_READS_PER_MINUTE = env_int("CONSOLE_READS_PER_MINUTE", 300, minimum=0)

# --- programs: the API (api/), its tokens, and traces ------------------------------------

# The longest a token may be made valid for, in days.
API_TOKEN_MAX_DAYS = env_int("API_TOKEN_MAX_DAYS", 365)
# Each token's calls a minute, counted in the cache; past it, 429 with Retry-After. 0: no limit.
API_REQUESTS_PER_MINUTE = env_int("API_REQUESTS_PER_MINUTE", 120, minimum=0)
# How long a program's plan waits for a signature before it can no longer be applied.
API_PLAN_HOURS = env_int("API_PLAN_HOURS", 72)
# Traces (tasks_app.observability.tracing): off unless on; sent by OTLP over HTTP to
# OTEL_EXPORTER_OTLP_ENDPOINT when that is set. The task page links to its trace with
# TASKS_TRACE_URL, a template with {trace_id} (e.g. https://jaeger.example/trace/{trace_id}).
TASKS_TRACING = env_bool("TASKS_TRACING", False)
TASKS_TRACE_URL = env_str("TASKS_TRACE_URL")

# --- mail: the approvals' notices (approvals.notices) ----------------------------------

# The review links in mail: the console's address as its readers reach it.
CONSOLE_BASE_URL = env_url("CONSOLE_BASE_URL", "http://127.0.0.1:8000")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL") or "Task console <task-console@localhost>"
# In production, or wherever EMAIL_HOST is set, mail goes out by SMTP (EMAIL_HOST, by
# default the local relay). Otherwise each message is written to a file under
# EMAIL_FILE_PATH, which the console's Mail page and `manage.py mailbox` read: the demo's
# mail, visible without a mail server.
MAIL_FILE_PATH = Path(env_str("EMAIL_FILE_PATH") or VAR_DIR / "mail")
if PRODUCTION or env_str("EMAIL_HOST"):
    MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {
                "host": env_str("EMAIL_HOST") or "localhost",
                "port": env_int("EMAIL_PORT", 587),
                "username": env_str("EMAIL_HOST_USER"),
                "password": env_str("EMAIL_HOST_PASSWORD"),
                "use_tls": env_bool("EMAIL_USE_TLS", default=True),
                "timeout": env_int("EMAIL_TIMEOUT", 30),
            },
        }
    }
else:
    MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.filebased.EmailBackend",
            "OPTIONS": {"file_path": str(MAIL_FILE_PATH)},
        }
    }
# The reminder before a request expires (a workflow's approval step may set its own);
# 0 for none.
APPROVALS_REMIND_BEFORE = timedelta(
    minutes=env_int("APPROVALS_REMIND_BEFORE_MINUTES", 6 * 60, minimum=0)
)
# One digest of the requests waiting for each approver, every APPROVALS_DIGEST_MINUTES,
# instead of one message per request (reminders and escalations still go one by one).
APPROVALS_MAIL_DIGEST = env_bool("APPROVALS_MAIL_DIGEST")
APPROVALS_DIGEST_MINUTES = env_int("APPROVALS_DIGEST_MINUTES", 24 * 60)

# --- logins (django-axes) ----------------------------------------------------------------

# Every login, the console's and the admin's, goes through axes' backend: after
# CONSOLE_LOGIN_ATTEMPTS failures of one username from one address, that pair is refused
# (even the right password) for CONSOLE_LOGIN_WINDOW_SECONDS after the last counted
# failure. The pair, not either alone: a stranger elsewhere cannot lock a user out, and one
# address (a shared office) cannot lock out its neighbours. Counted in the database, so it
# neither depends on Redis nor forgets on a restart. Unlock: `manage.py
# axes_reset_username USERNAME` (README, Logins).
#
# Beyond the pair, a username is slowed, never locked: after CONSOLE_LOGIN_USERNAME_CEILING
# failures within the window from any addresses it takes one try every window / ceiling
# seconds (30 s by default), from anywhere; a try sooner answers 429 with Retry-After and is
# not counted (console/logins.py; the TasksLoginUsernameSlowed alert).
AUTHENTICATION_BACKENDS = [
    # axes' AxesStandaloneBackend, then the username's ceiling
    "console.logins.LoginBackend",
    "django.contrib.auth.backends.ModelBackend",
]
CONSOLE_LOGIN_USERNAME_CEILING = env_int("CONSOLE_LOGIN_USERNAME_CEILING", 30)
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_FAILURE_LIMIT = env_int("CONSOLE_LOGIN_ATTEMPTS", 5)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("CONSOLE_LOGIN_WINDOW_SECONDS", 900))
# Tries while locked out are refused without being counted, so the lockout ends when it
# said it would; a successful login clears that pair's count.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_RESET_ON_SUCCESS = True
# The address is the client's as tasks_app/addresses.py decides it:
# X-Forwarded-For only from TRUSTED_PROXY_NETWORKS.
AXES_CLIENT_IP_CALLABLE = "tasks_app.addresses.client_address"
# The refused login page itself (its form says why), with axes' status (429).
AXES_LOCKOUT_CALLABLE = "console.logins.lockout_response"
AXES_HTTP_RESPONSE_CODE = 429
# No table of every successful login: nothing would prune it.
AXES_DISABLE_ACCESS_LOG = True
