"""`make run`'s process manager: honcho, given time for the worker's warm shutdown.

On Ctrl-C honcho sends each process SIGTERM and kills what is still running after
``honcho.manager.KILL_WAIT`` seconds (5). A Celery worker on the embedded file-system
broker takes about that long to notice the signal, close its pool and stop, so honcho
would kill it mid-shutdown; here it waits up to :data:`GRACE_SECONDS` instead (a step
still running finishes first). A second Ctrl-C asks again; it does not cut the wait short.

    python scripts/dev_processes.py start -f Procfile.dev   (honcho's own arguments)
"""

from __future__ import annotations

from honcho import command, manager

GRACE_SECONDS = 30


def main() -> None:
    manager.KILL_WAIT = GRACE_SECONDS
    command.main()


if __name__ == "__main__":
    main()
