"""The settings Django reads (``config.settings``), all from the environment.

With nothing set it runs on the embedded default: SQLite and Celery's file-system broker
under ``var/``. ``DATABASE_URL`` and ``REDIS_URL`` switch to PostgreSQL and Redis.
``DJANGO_PRODUCTION`` refuses to start without a secret key, allowed hosts, PostgreSQL and
Redis, and the real remotes of the shipped workflows; every refused setting is named at once.
"""

# The settings by concern, each module under ~400 lines, gathered here for Django. A module
# imports by name what it reads of another (production mode, the var folder), and no name
# is set in two of them, so their order does not matter.
from config.env import stop_if_refused as _stop_if_refused
from config.settings_console import *  # noqa: F403
from config.settings_django import *  # noqa: F403
from config.settings_django import TASKS_LOG_FORMAT as _LOG_FORMAT
from config.settings_tasks import *  # noqa: F403

# A setting the modules refused (a missing secret, a malformed number, a fake remote in
# production) did not stop them: they read on, so every one is named here at once, and the
# process stops before anything starts (config.env).
_stop_if_refused(_LOG_FORMAT)
