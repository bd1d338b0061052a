"""One DTDB worker process: ``manage.py db_worker`` as its users run it, with the bench's
settings (``bench.dtdb_settings``), plus the harness's barrier before it: Django set up
and its connection open (persistent, ``CONN_MAX_AGE=None``), say ready, wait for the go
signal, then the command itself until SIGTERM. ``python -m bench.dtdb_worker``.

Options: the bench queue; a poll every 0.1 s when idle (the default is 1 s); no random
start-up delay (up to 1 s against a thundering herd of starting workers: boot, which no
system is timed for); a worker id of its own; verbosity 0, as the harness runs every
worker quiet (at 1 it logs two lines per task).
"""

from __future__ import annotations

import os

INTERVAL_S = 0.1


def main() -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.dtdb_settings"
    import django

    django.setup()
    from django.core.management import execute_from_command_line
    from django.db import connection

    from bench.common import mark_ready, wait_for_go
    from bench.dtdb_app import QUEUE

    connection.ensure_connection()
    mark_ready()
    wait_for_go()
    execute_from_command_line(
        [
            "manage.py",
            "db_worker",
            "--queue-name",
            QUEUE,
            "--interval",
            str(INTERVAL_S),
            "--no-startup-delay",
            "--no-reload",
            "--worker-id",
            f"bench-{os.getpid()}",
            "--verbosity",
            "0",
        ]
    )


if __name__ == "__main__":
    main()
