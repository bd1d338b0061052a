"""Time one console page over one database: ``python -m bench.pages <page>``.

Run with ``DJANGO_SETTINGS_MODULE=config.settings`` and ``DATABASE_URL`` pointing at a
console data set. It logs a superuser in with ``django.test.Client`` (``force_login``),
warms the page up, then answers the harness one command a line on stdin, one JSON line
each on stdout:

- ``get``: one GET, timed with ``time.perf_counter`` around the client call;
- ``explain``: one more GET inside ``CaptureQueriesContext``: the number of queries, their
  time, and ``EXPLAIN (ANALYZE, BUFFERS)`` of the slowest SELECTs;
- ``quit`` (or end of input).

The harness (:class:`PageProcess`) runs one such process per data set and alternates the
GETs between them, so a busy moment of the machine lands on both sizes alike. Every answer
must be 200: the first that is not is reported as ``{"error": ...}`` with its status and
the first 300 characters of its body, and the process exits 3.

By hand: ``python -m bench.pages overview --gets 20`` prints the times of 20 GETs.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

PAGES = {
    "overview": "/",
    "tasks": "/tasks/",
    "metrics": "/metrics",
    # The day's figures (the default window); one workflow's page for the one with dead
    # letters and retries in the data set (bench/dataset.py).
    "workflows": "/workflows/",
    "workflow": "/workflows/demo.flaky/",
    "dead_groups": "/dead/groups/",
}
USERNAME = "bench-console"
EXPLAINED = 3  # the slowest SELECTs of the captured request that get a plan
PLAN_CHARS = 4000


class BadAnswer(Exception):
    pass


# --- inside the page process ----------------------------------------------------------------


class Page:
    def __init__(self, url: str) -> None:
        from django.contrib.auth import get_user_model
        from django.test import Client

        self.url = url
        user_model = get_user_model()
        user = user_model.objects.filter(username=USERNAME).first()
        if user is None:
            user = user_model.objects.create_superuser(USERNAME, f"{USERNAME}@example.com", None)
        # The settings allow localhost (not the test client's "testserver") outside tests;
        # a view's exception is answered with a 500 (its traceback is logged to stderr).
        self.client = Client(headers={"host": "localhost"}, raise_request_exception=False)
        self.client.force_login(user)

    def get(self) -> dict[str, Any]:
        began = time.perf_counter()
        response = self.client.get(self.url)
        elapsed = time.perf_counter() - began
        if response.status_code != 200:
            body = " ".join(response.content[:300].decode("utf-8", "replace").split())
            where = f" (to {response['Location']})" if response.has_header("Location") else ""
            raise BadAnswer(f"GET {self.url} answered {response.status_code}{where}: {body}")
        return {"ms": elapsed * 1000, "bytes": len(response.content)}

    def explain(self) -> dict[str, Any]:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as captured:
            self.get()
        queries = [(str(q["sql"]), float(q["time"]) * 1000) for q in captured.captured_queries]
        reads = [q for q in queries if q[0].lstrip().upper().startswith(("SELECT", "WITH"))]
        slowest: list[dict[str, Any]] = []
        with connection.cursor() as cursor:
            for sql, ms in sorted(reads, key=lambda q: -q[1])[:EXPLAINED]:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
                plan = "\n".join(str(row[0]) for row in cursor.fetchall())
                slowest.append({"sql": sql, "ms": ms, "plan": plan[:PLAN_CHARS]})
        return {
            "queries": len(queries),
            "queries_ms": sum(ms for _, ms in queries),
            "slowest": slowest,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pages", description=__doc__)
    parser.add_argument("page", choices=sorted(PAGES))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--gets", type=int, help="time this many GETs and print them, alone")
    args = parser.parse_args(argv)
    # The replies get stdout to themselves: whatever else writes to it goes to stderr.
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()

    def reply(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message) + "\n")

    try:
        page = Page(PAGES[args.page])
        for _ in range(args.warmup):
            page.get()
        if args.gets:
            times = [page.get()["ms"] for _ in range(args.gets)]
            reply({"median_ms": statistics.median(times), "times_ms": times, **page.explain()})
            return 0
        reply({"ready": True})
        for line in sys.stdin:
            command = line.strip()
            if command == "get":
                reply(page.get())
            elif command == "explain":
                reply(page.explain())
            elif command == "quit":
                break
            else:
                reply({"error": f"unknown command {command!r}"})
    except BadAnswer as exc:
        reply({"error": str(exc)})
        return 3
    return 0


# --- in the harness ---------------------------------------------------------------------------


class PageProcess:
    """One ``bench.pages`` process: started, asked, stopped (also when the cell fails)."""

    def __init__(
        self, python: str, page: str, *, env: dict[str, str], cwd: Path, log: Path, warmup: int
    ) -> None:
        self.log_path = log
        self.log: IO[bytes] = log.open("wb")
        self.proc = subprocess.Popen(  # noqa: S603
            [python, "-m", "bench.pages", page, "--warmup", str(warmup)],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        self.pending = b""

    def ask(self, command: str | None, timeout: float) -> dict[str, Any]:
        """Send ``command`` (None: only read) and wait for its reply line."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if command is not None:
            self.proc.stdin.write(command.encode() + b"\n")
            self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"bench.pages gave no reply to {command} within {timeout:g} s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.proc.wait(timeout=10)
                    raise RuntimeError(f"bench.pages exited {self.proc.returncode}\n{self.tail()}")
                self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        if message.get("error"):
            raise BadAnswer(str(message["error"]))
        return message

    def tail(self, chars: int = 4000) -> str:
        self.log.flush()
        return self.log_path.read_bytes()[-chars:].decode("utf-8", "replace")

    def stop(self) -> None:
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write(b"quit\n")
                self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=10)
        finally:
            self.log.close()


if __name__ == "__main__":
    sys.exit(main())
