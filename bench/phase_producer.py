"""The producer of the horizon and faults cells: one process for a whole cell, an open loop
over a schedule of segments (a rate for some seconds, then another), so the phases follow
one another with no gap. ``python -m bench.phase_producer SYSTEM --segments 100:20,500:10
--started FILE --out FILE [--effect]``.

Task ``i`` is due at its segment's start plus ``j / rate`` (its ``j``-th in the segment); a
pool of sender threads sends each when it is due, or at once when late (no coordinated
omission), as ``bench/producer.py``'s open loop does. Once every sender's connection is
open the clock starts, and its start (seconds since the epoch) is written to ``--started``
so the harness can align its phases with it. A failed send (the database restarting, its
backend terminated) is counted and the sender goes on with the next task: the task was not
enqueued, as its producer was told. ``--effect`` sends the faults cell's job (an external
effect, ``bench/fake_remote.py``) instead of the no-op.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.producer import CLIENTS, Client, PgqClient, ProcClient, UsClient


class UsEffectClient(UsClient):
    def __init__(self) -> None:
        super().__init__()
        from bench.effect_workflow import WORKFLOW

        self.workflow = WORKFLOW

    def send_one(self, seq: int) -> int:
        task_id: int = self.services.enqueue(self.workflow, {}).task.pk
        return task_id


class ProcEffectClient(ProcClient):
    def send_one(self, seq: int) -> int:
        job_id: int = self.proc.effect.defer()
        return job_id


class PgqEffectClient(PgqClient):
    def send_one(self, seq: int) -> int:
        from bench.pgq_app import EFFECT_ENTRYPOINT

        loop, queries = self._queries()
        ids = loop.run_until_complete(queries.enqueue(EFFECT_ENTRYPOINT, None))
        return int(ids[0])


EFFECT_CLIENTS: dict[str, Callable[[], Client]] = {
    "us": UsEffectClient,
    "proc10": ProcEffectClient,
    "pgq": PgqEffectClient,
}


def due_times(segments: list[tuple[float, float]]) -> list[float]:
    """Each task's due time in seconds from the clock's start: ``rate`` a second for
    ``seconds``, segment after segment."""
    out: list[float] = []
    start = 0.0
    for rate, seconds in segments:
        out += [start + j / rate for j in range(int(rate * seconds))]
        start += seconds
    return out


def forget_connection(client: Client) -> None:
    """After a failed send: a client that keeps a connection per thread (PgQueuer's
    asyncpg) opens a new one at its next send, as a producer that retries would; the
    others' pools and Django's connection handling do this themselves."""
    local = getattr(client, "local", None)
    if local is not None and hasattr(local, "state"):
        del local.state


def run(client: Client, segments: list[tuple[float, float]], senders: int, started: Path) -> Any:
    due = due_times(segments)
    ready = threading.Barrier(senders + 1)
    lock = threading.Lock()
    state = {"next": 0}
    records: list[tuple[int, float, float]] = []
    errors: list[tuple[float, str]] = []
    t0_box: list[float] = []

    def sender() -> None:
        try:
            client.send_one(-1)  # warm, unmeasured
        except Exception as exc:
            errors.append((0.0, f"warm-up: {exc!r}"))
        ready.wait()
        t0 = t0_box[0]
        try:
            while True:
                with lock:
                    i = state["next"]
                    state["next"] += 1
                if i >= len(due):
                    return
                delay = t0 + due[i] - time.time()
                if delay > 0:
                    time.sleep(delay)
                try:
                    ident = client.send_one(i)
                except Exception as exc:
                    errors.append((time.time() - t0, repr(exc)[:300]))
                    forget_connection(client)
                    continue
                sent = time.time()
                with lock:
                    records.append((ident, t0 + due[i], sent))
        finally:
            client.end_thread()

    threads = [threading.Thread(target=sender, daemon=True) for _ in range(senders)]
    for thread in threads:
        thread.start()
    t0_box.append(time.time() + 0.2)
    ready.wait()
    started.write_text(repr(t0_box[0]))
    total = sum(seconds for _, seconds in segments)
    for thread in threads:
        thread.join(timeout=total * 3 + 60)
    return {
        "t0": t0_box[0],
        "count": len(due),
        "sent": len(records),
        "error_count": len(errors),
        # When each send failed (seconds from the clock's start) and why: the first 200.
        "errors": errors[:200],
        "records": records,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.phase_producer")
    parser.add_argument("system", choices=sorted(CLIENTS))
    parser.add_argument("--segments", required=True, help="rate:seconds,rate:seconds,...")
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--effect", action="store_true")
    parser.add_argument("--started", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    segments = [
        (float(rate), float(seconds))
        for rate, seconds in (part.split(":") for part in args.segments.split(","))
    ]
    client = (EFFECT_CLIENTS if args.effect else CLIENTS)[args.system]()
    try:
        result = run(client, segments, args.senders, Path(args.started))
    finally:
        client.close()
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
