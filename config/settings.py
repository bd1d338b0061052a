"""The settings Django reads (``config.settings``), all from the environment.

With nothing set it runs on the embedded default: SQLite and Celery's file-system broker
under ``var/``. ``DATABASE_URL`` and ``REDIS_URL`` switch to PostgreSQL and Redis.
``DJANGO_PRODUCTION`` refuses to start without a secret key, allowed hosts, PostgreSQL and
Redis, and the real remotes of the shipped workflows.
"""

# The settings by concern, each module under ~400 lines, gathered here for Django. A module
# imports by name what it reads of another (production mode, the var folder), and no name
# is set in two of them, so their order does not matter.
from config.settings_console import *  # noqa: F403
from config.settings_django import *  # noqa: F403
from config.settings_tasks import *  # noqa: F403
