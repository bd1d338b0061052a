"""Loading the settings in a fresh interpreter with an environment of a test's choosing,
and the environment production needs to start."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.e2e_support import ROOT


def clean_env(**env: str) -> dict[str, str]:
    """This process's environment without its Django and task settings, plus ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TASKS_"))}
    return {**clean, "DJANGO_SETTINGS_MODULE": "config.settings", **env}


def load_settings(code: str = "print('ok')", **env: str) -> subprocess.CompletedProcess[str]:
    """Set Django up in a fresh interpreter with ``env``, then run ``code``. An empty value
    unsets a variable (``DATABASE_URL=""`` is the embedded database)."""
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# Everything production needs to start (servers nobody connects to while settings load).
PRODUCTION = {
    "DJANGO_PRODUCTION": "1",
    "DJANGO_SECRET_KEY": "x" * 60,
    "DJANGO_ALLOWED_HOSTS": "example.com",
    "DATABASE_URL": "postgres://u@127.0.0.1:5432/x",
    "REDIS_URL": "redis://127.0.0.1:6379/0",
    "PUBLISH_URL": "https://publish.example.com/api/",
    "MAIL_URL": "https://mail.example.com/api/",
}
