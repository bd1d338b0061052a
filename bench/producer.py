"""The producer side of every cell, in a subprocess of its own for each run of a cell, so
each system's client starts from the same clean process and the harness stays free of
Django. ``python -m bench.producer SYSTEM MODE ... --out FILE`` writes its result as JSON.

Modes:
- ``single``: ``--n`` tasks, one call each; times the calls after a small warm-up.
- ``bulk``: ``--n`` tasks in batches of ``--batch``, each batch one call (the system's bulk
  API: ``enqueue_many``, ``batch_defer``, ``Queries.enqueue`` with lists, one multi-row
  INSERT; plain Celery has none, so a batch is a loop of ``apply_async`` over one producer
  connection). DBOS and django-tasks-db have none either: for them this mode only
  pre-fills a drain, a loop of single enqueues in one transaction per batch, and the
  enqueue cell reports no bulk figure.
- ``openloop``: task ``i`` is due at ``t0 + i / rate``; a pool of sender threads sends
  each one when it is due (or at once when late), recording the scheduled and the actual
  send time and the task's id. Latency is measured from the scheduled time.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from bench.common import ENV_DSN, PLAIN_QUEUE


class Client(Protocol):
    def send_one(self, seq: int) -> int: ...

    def send_batch(self, n: int) -> list[int]: ...

    def end_thread(self) -> None: ...

    def close(self) -> None: ...


def _django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


class UsClient:
    """Our durable core, through its public service API."""

    def __init__(self) -> None:
        _django()
        from tasks_app import services

        self.services = services

    def send_one(self, seq: int) -> int:
        task_id: int = self.services.enqueue("demo.noop", {}).task.pk
        return task_id

    def send_batch(self, n: int) -> list[int]:
        items = [{"workflow": "demo.noop", "payload": {}} for _ in range(n)]
        return [result.task.pk for result in self.services.enqueue_many(items)]

    def end_thread(self) -> None:
        from django.db import connection

        connection.close()

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


class UsLimitedClient(UsClient):
    """US/LIM: ``bench.limited`` (``bench/limited_workflow.py``), through the same API."""

    def __init__(self) -> None:
        super().__init__()
        from bench import limited_workflow

        self.limited = limited_workflow

    def send_one(self, seq: int) -> int:
        workflow, payload = self.limited.WORKFLOW, self.limited.payload(seq)
        task_id: int = self.services.enqueue(workflow, payload).task.pk
        return task_id

    def send_batch(self, n: int) -> list[int]:
        items = [
            {"workflow": self.limited.WORKFLOW, "payload": self.limited.payload(i)}
            for i in range(n)
        ]
        return [result.task.pk for result in self.services.enqueue_many(items)]


class CeleryClient:
    """A plain Celery task, sent to its own queue."""

    def __init__(self) -> None:
        _django()
        from bench import plain_tasks
        from config.celery import app

        self.app = app
        self.task = plain_tasks.noop

    def send_one(self, seq: int) -> int:
        self.task.apply_async(args=(seq,), queue=PLAIN_QUEUE)
        return seq

    def send_batch(self, n: int) -> list[int]:
        with self.app.producer_or_acquire() as producer:
            for _ in range(n):
                self.task.apply_async(queue=PLAIN_QUEUE, producer=producer)
        return []

    def end_thread(self) -> None:
        pass

    def close(self) -> None:
        self.app.close()


class ProcClient:
    """procrastinate's synchronous defer / batch_defer."""

    def __init__(self) -> None:
        from bench.proc_app import make_app

        self.proc = make_app()
        self.proc.app.open()

    def send_one(self, seq: int) -> int:
        job_id: int = self.proc.noop.defer()
        return job_id

    def send_batch(self, n: int) -> list[int]:
        ids: list[int] = self.proc.noop.batch_defer(*({} for _ in range(n)))
        return ids

    def end_thread(self) -> None:
        pass

    def close(self) -> None:
        self.proc.app.close()


class RawClient:
    """Plain INSERTs on one autocommit connection per thread."""

    def __init__(self) -> None:
        import psycopg

        self.psycopg = psycopg
        self.local = threading.local()
        self.opened: list[Any] = []
        self.lock = threading.Lock()

    def _conn(self) -> Any:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.psycopg.connect(os.environ[ENV_DSN], autocommit=True)
            self.local.conn = conn
            with self.lock:
                self.opened.append(conn)
        return conn

    def send_one(self, seq: int) -> int:
        from bench.raw import INSERT_ONE

        row = self._conn().execute(INSERT_ONE, ("{}",)).fetchone()
        return int(row[0])

    def send_batch(self, n: int) -> list[int]:
        from bench.raw import INSERT_MANY

        conn = self._conn()
        with conn.transaction():
            rows = conn.execute(INSERT_MANY, (["{}"] * n,)).fetchall()
        return [int(row[0]) for row in rows]

    def end_thread(self) -> None:
        pass

    def close(self) -> None:
        for conn in self.opened:
            conn.close()


class PgqClient:
    """PgQueuer's ``Queries.enqueue`` on asyncpg, driven from synchronous code: each thread
    has its own event loop and connection (the open loop's senders are threads)."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.opened: list[Any] = []
        self.lock = threading.Lock()

    def _queries(self) -> tuple[Any, Any]:
        state = getattr(self.local, "state", None)
        if state is None:
            import asyncio

            import asyncpg
            from pgqueuer.db import AsyncpgDriver
            from pgqueuer.queries import Queries

            loop = asyncio.new_event_loop()
            connection = loop.run_until_complete(asyncpg.connect(os.environ[ENV_DSN]))
            state = (loop, Queries(AsyncpgDriver(connection)), connection)
            self.local.state = state
            with self.lock:
                self.opened.append(state)
        return state[0], state[1]

    def send_one(self, seq: int) -> int:
        from bench.pgq_app import ENTRYPOINT

        loop, queries = self._queries()
        ids = loop.run_until_complete(queries.enqueue(ENTRYPOINT, None))
        return int(ids[0])

    def send_batch(self, n: int) -> list[int]:
        from bench.pgq_app import ENTRYPOINT

        loop, queries = self._queries()
        ids = loop.run_until_complete(queries.enqueue([ENTRYPOINT] * n, [None] * n, [0] * n))
        return [int(job_id) for job_id in ids]

    def end_thread(self) -> None:
        pass

    def close(self) -> None:
        for loop, _, connection in self.opened:
            loop.run_until_complete(connection.close())
            loop.close()


class DbosClient:
    """``DBOSClient.enqueue``: how code outside a DBOS application (a web process)
    enqueues a workflow. Each single call names its workflow by a number (the producer's
    start in microseconds plus the sequence number) so the latency cell can find it."""

    def __init__(self) -> None:
        from dbos import DBOSClient

        from bench.dbos_app import SCHEMA, system_database_url

        self.url = system_database_url(os.environ[ENV_DSN])
        self.client = DBOSClient(system_database_url=self.url, dbos_system_schema=SCHEMA)
        self.base = time.time_ns() // 1000  # distinct from any earlier producer's ids
        self.engine: Any = None

    def _options(self, workflow_id: str | None = None) -> Any:
        from bench.dbos_app import QUEUE, WORKFLOW

        options: dict[str, Any] = {"workflow_name": WORKFLOW, "queue_name": QUEUE}
        if workflow_id is not None:
            options["workflow_id"] = workflow_id
        return options

    def send_one(self, seq: int) -> int:
        ident = self.base + seq
        self.client.enqueue(self._options(str(ident)))
        return ident

    def send_batch(self, n: int) -> list[int]:
        # No batch API: the pre-fill enqueues one by one in one transaction per batch.
        import sqlalchemy

        if self.engine is None:
            self.engine = sqlalchemy.create_engine(self.url)
        with self.engine.begin() as conn:
            for _ in range(n):
                self.client.enqueue_in_transaction(conn, self._options())
        return []

    def end_thread(self) -> None:
        pass

    def close(self) -> None:
        self.client.destroy()
        if self.engine is not None:
            self.engine.dispose()


class DtdbClient:
    """Django's tasks framework with the django-tasks-db backend: ``Task.enqueue``, in a
    Django project of its own (``bench.dtdb_settings``); a task's UUID is returned as a
    number."""

    def __init__(self) -> None:
        os.environ["DJANGO_SETTINGS_MODULE"] = "bench.dtdb_settings"
        import django

        django.setup()
        from bench.dtdb_app import noop

        self.task = noop

    def send_one(self, seq: int) -> int:
        result = self.task.enqueue()
        return uuid.UUID(str(result.id)).int

    def send_batch(self, n: int) -> list[int]:
        # No batch API: the pre-fill enqueues one by one in one transaction per batch.
        from django.db import transaction

        with transaction.atomic():
            for _ in range(n):
                self.task.enqueue()
        return []

    def end_thread(self) -> None:
        from django.db import connection

        connection.close()

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


CLIENTS: dict[str, Callable[[], Client]] = {
    "us": UsClient,
    "procfile": UsClient,
    "uslimited": UsLimitedClient,
    "celery": CeleryClient,
    "proc": ProcClient,
    "proc10": ProcClient,
    "raw": RawClient,
    "pgq": PgqClient,
    "pgq100": PgqClient,
    "dbos": DbosClient,
    "dtdb": DtdbClient,
}

WARMUP = 20  # unmeasured calls first: connections opened, caches warm


def single(client: Client, n: int) -> dict[str, Any]:
    for i in range(WARMUP):
        client.send_one(-1 - i)
    started = time.perf_counter()
    for i in range(n):
        client.send_one(i)
    elapsed = time.perf_counter() - started
    return {"count": n, "elapsed": elapsed, "rate": n / elapsed}


def bulk(client: Client, n: int, batch: int, *, warmup: bool = True) -> dict[str, Any]:
    if warmup:
        client.send_batch(min(batch, WARMUP))
    ids: list[int] = []
    started = time.perf_counter()
    left = n
    while left > 0:
        size = min(batch, left)
        ids += client.send_batch(size)
        left -= size
    elapsed = time.perf_counter() - started
    return {"count": n, "elapsed": elapsed, "rate": n / elapsed, "ids": len(ids)}


def openloop(client: Client, rate: float, duration: float, senders: int) -> dict[str, Any]:
    total = max(int(rate * duration), 1)
    # Every sender's connection is opened before the clock starts.
    ready = threading.Barrier(senders + 1)
    lock = threading.Lock()
    state = {"next": 0}
    records: list[tuple[int, float, float]] = []
    errors: list[str] = []
    t0_box: list[float] = []

    def sender() -> None:
        try:
            client.send_one(-1 - threading.get_ident() % 1000)  # warm, unmeasured
        except Exception as exc:
            errors.append(f"warm-up: {exc!r}")
        ready.wait()
        t0 = t0_box[0]
        try:
            while True:
                with lock:
                    i = state["next"]
                    state["next"] += 1
                if i >= total:
                    return
                due = t0 + i / rate
                delay = due - time.time()
                if delay > 0:
                    time.sleep(delay)
                try:
                    ident = client.send_one(i)
                except Exception as exc:
                    errors.append(repr(exc))
                    continue
                sent = time.time()
                with lock:
                    records.append((ident, due, sent))
        finally:
            client.end_thread()

    threads = [threading.Thread(target=sender, daemon=True) for _ in range(senders)]
    for thread in threads:
        thread.start()
    t0_box.append(time.time() + 0.2)
    ready.wait()
    for thread in threads:
        thread.join(timeout=duration * 10 + 60)
    return {
        "count": total,
        "sent": len(records),
        "errors": errors[:20],
        "error_count": len(errors),
        "records": records,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.producer")
    parser.add_argument("system", choices=sorted(CLIENTS))
    parser.add_argument("mode", choices=["single", "bulk", "openloop"])
    parser.add_argument("--n", type=int, default=0)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--duration", type=float, default=0.0)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--no-warmup", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    client = CLIENTS[args.system]()
    try:
        if args.mode == "single":
            result = single(client, args.n)
        elif args.mode == "bulk":
            result = bulk(client, args.n, args.batch, warmup=not args.no_warmup)
        else:
            result = openloop(client, args.rate, args.duration, args.senders)
    finally:
        client.close()
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
