"""What chaining costs (docs/audit.md): events per second written by N processes on their
own connections, each event its own transaction, plain, under the chain's advisory lock
alone, and chained (``audit_chain.append``).

    DATABASE_URL=postgres://…/scratch .venv/bin/python scripts/measure_audit_chain.py

Run it on a migrated scratch database: it writes events it cannot delete. ``SECONDS``
(default 5) and ``CONNECTIONS`` (default ``1,4,8,16``) tune it.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django

django.setup()

from django.db import connection, transaction  # noqa: E402

from tasks_app.history import audit_chain, audit_verify  # noqa: E402
from tasks_app.models import Event, EventKind  # noqa: E402

SECONDS = float(os.environ.get("SECONDS", "5"))
WAYS = ("plain", "lock", "chained")


def write(way: str, writer: int) -> int:
    """Write events ``way`` for ``SECONDS``; return how many."""
    connection.close()  # a connection of this process's own, not the parent's
    written = 0
    end = time.monotonic() + SECONDS
    while time.monotonic() < end:
        with transaction.atomic():
            event = Event(
                task_id=writer,
                kind=EventKind.CANCELLED if way == "chained" else EventKind.CLAIMED,
                actor=f"worker:measure-{writer}",
                data={"token": written, "steps": {"1": ["running", 1, written]}},
            )
            if way == "chained":
                audit_chain.append(event)
            else:
                if way == "lock":
                    audit_chain.lock()
                event.save()
        written += 1
    connection.close()
    return written


def main() -> None:
    connection.close()
    context = multiprocessing.get_context("fork")
    for n in (int(x) for x in os.environ.get("CONNECTIONS", "1,4,8,16").split(",")):
        for way in WAYS:
            with context.Pool(n) as pool:
                counts = pool.starmap(write, [(way, i) for i in range(n)])
            print(f"{n:>3} connections, {way:8}: {sum(counts) / SECONDS:8.0f} events/s", flush=True)
    verdict = audit_verify.verify()
    print(f"chain verifies: {verdict.ok}, {verdict.checked} chained event(s)")


if __name__ == "__main__":
    main()
