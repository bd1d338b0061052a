"""A crash costs only the step that crashed: what a worker's pool process holds, written
where its parent finds it once the process dies, and handed back at once.

A pool process (a Celery prefork child) runs a batch of claims one step after another
(``runner.run_batch``) and records their successes together at the end. Should one step
kill the process, the rest of the batch would sit ``running`` until their leases ran out,
each then charged an attempt it never had. So the process keeps a small file of its own:
the batch once when it is claimed, the index of the running step (a few bytes written in
place, no database write) before each step, and nothing once the batch is recorded. A thread
of its parent (the worker's main process, :class:`ChildWatcher`) sees the child exit
within a fraction of a second, reads the file and:

1. releases every claim of the batch but the running step's, without charging its attempt
   (``leases.release_claim``): the steps not started, and those whose handler had returned
   but whose success was not recorded yet (they run again; the effects ledger keeps their
   side effects at most once, and execution is at least once anyway);
2. ends the running step's lease now (``leases.expire_lease_now``): it may be what killed
   the process, so it keeps the treatment of an expired lease, from the sweeper's next
   sweep instead of the lease's end: ``lease_expired``, its attempt charged, and claimed
   in a batch of its own after that. When the process died after every handler of its
   batch had returned, no step is to blame and every claim is released.

Both are fenced by token: a claim whose outcome the process recorded before it died is
left alone. If the whole worker went (its main process too), nobody reads the file and the
leases run out as before. The files live in a directory the main process makes when it
starts (``prepare``), watched once its pool runs (``watch``), removed when it stops
(``clean_up``); made again whenever something removed it meanwhile, and while it cannot
be, crash isolation is off and says so (``tasks_app.engine.claims_directory``).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import secrets
import shutil
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from django.db import connections

from tasks_app.engine import claims_directory, leases
from tasks_app.engine.claims_directory import ClaimsDirectory, make_private, parent
from tasks_app.engine.leases import Claim
from tasks_app.engine.presence import process_running

logger = logging.getLogger(__name__)

# The file starts with the index of the running step, right-aligned in this many bytes
# (the last one a newline), so the index is rewritten in place; the batch follows as one
# line of JSON. An index of -1: no handler started yet; the batch's length: every handler
# returned.
INDEX_BYTES = 12
NOTHING_STARTED = -1


class ClaimsRecord:
    """What this process holds, in its file (a no-op until :meth:`open` in a pool process).

    Written without flushing to disk: the kernel keeps a dead process's writes, and a lost
    machine takes the parent that would read them along.
    """

    def __init__(self) -> None:
        self._fd: int | None = None
        self._pid = 0
        self._path: Path | None = None

    def open(self, path: Path) -> None:
        """Record into ``path`` from now on (emptied: nothing held)."""
        self.close()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        self._pid = os.getpid()
        self._path = path

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None

    @property
    def is_open(self) -> bool:
        # A process forked from one that records has a file of its own, or none.
        return self._fd is not None and self._pid == os.getpid()

    def holding(self, claims: Sequence[Claim]) -> None:
        """The batch just claimed; no handler started."""
        self._reopen_if_removed()
        if not self.is_open:
            return
        body = json.dumps(
            [
                [c.step_id, c.task_id, c.token, c.attempt, c.worker_id, c.lease_seconds, c.queue]
                for c in claims
            ],
            separators=(",", ":"),
        )
        data = _index(NOTHING_STARTED) + body.encode() + b"\n"

        def write(fd: int) -> None:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))

        self._write(write)

    def running(self, index: int) -> None:
        """The handler of the batch's step ``index`` starts now (the batch's length: every
        handler returned)."""
        self._write(lambda fd: os.pwrite(fd, _index(index), 0))

    def clear(self) -> None:
        """The batch's outcomes are recorded: nothing held."""
        self._write(lambda fd: os.ftruncate(fd, 0))

    def _reopen_if_removed(self) -> None:
        """A file removed with its directory is where nobody looks: a new one in its place
        (the directory made again, if the main process has not yet). While that fails the
        batch goes unrecorded, and a crash's batch-mates wait for their leases."""
        if not self.is_open or self._fd is None or self._path is None:
            return
        with contextlib.suppress(OSError):
            if os.fstat(self._fd).st_nlink == 0:
                make_private(self._path.parent)
                self.open(self._path)

    def _write(self, write: Callable[[int], object]) -> None:
        """Write, unless not recording; a write that fails (a full disk) stops the record,
        never the batch: the leases then run out as they would without it."""
        if self._fd is None or self._pid != os.getpid():
            return
        try:
            write(self._fd)
        except OSError as exc:
            logger.warning("stopped recording this process's claims (%s)", exc)
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            self.close()


def _index(index: int) -> bytes:
    return f"{index:>{INDEX_BYTES - 1}}\n".encode()


record = ClaimsRecord()


@dataclass(frozen=True)
class HeldBatch:
    """A dead process's batch as its file tells it."""

    claims: list[Claim]
    # The step whose handler ran when the process died; NOTHING_STARTED (none yet), or
    # len(claims) (every handler had returned).
    running: int

    @property
    def culprit(self) -> Claim | None:
        """The claim whose handler ran when the process died, if one did."""
        return self.claims[self.running] if 0 <= self.running < len(self.claims) else None


def read_batch(path: Path) -> HeldBatch | None:
    """The batch recorded in ``path``; None when it holds nothing, or was cut mid-write (the
    leases then run out as they would without it)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) <= INDEX_BYTES:
        return None
    try:
        running = int(data[:INDEX_BYTES])
        # A longer batch written before may follow the newline that ends this one.
        rows = json.loads(data[INDEX_BYTES:].split(b"\n", 1)[0])
        claims = [
            Claim(
                step_id=step_id,
                task_id=task_id,
                token=token,
                attempt=attempt,
                worker_id=worker_id,
                lease_seconds=lease_seconds,
                queue=queue,
            )
            for step_id, task_id, token, attempt, worker_id, lease_seconds, queue in rows
        ]
    except (ValueError, TypeError):
        logger.warning("could not read the claims in %s; their leases will run out", path)
        return None
    return HeldBatch(claims=claims, running=running)


@dataclass(frozen=True)
class Recovery:
    released: int
    expired: int


def hand_back(batch: HeldBatch, *, actor: str) -> Recovery:
    """Release the batch's claims but the culprit's, without charging their attempts, then
    end the culprit's lease now. Steps 1 and 2 of the module's story."""
    culprit = batch.culprit
    released = 0
    for index, claim in enumerate(batch.claims):
        if claim is culprit:
            continue
        ran = index < batch.running
        if leases.release_claim(
            claim,
            actor=actor,
            reason="worker_lost",
            ran=ran,
            running_step=culprit.step_id if culprit is not None else None,
        ):
            released += 1
    expired = int(culprit is not None and leases.expire_lease_now(culprit))
    return Recovery(released=released, expired=expired)


# --- the worker's main process ----------------------------------------------------------------

# How often the main process looks for pool processes that died. Celery's own pool notices a
# child that died running a job only at its next check, up to five seconds later.
WATCH_SECONDS = 0.2

_directory: ClaimsDirectory | None = None
_watcher: ChildWatcher | None = None
# Pool processes whose death this process is telling of, or has told of lately (a pid is
# not reused within a few seconds).
_telling: collections.deque[int] = collections.deque(maxlen=256)


def will_tell(pid: int) -> bool:
    """Whether the death of pool process ``pid`` is (or will be) told by this module's one
    line: it held a batch, so :func:`recover` names the step it took down. The log filter that drops
    billiard's own line for it asks this (``tasks_app.observability.logs.OneLinePerCrash``)."""
    if pid in _telling:
        return True
    if _directory is None:
        return False
    batch = read_batch(_directory.path / str(pid))
    return batch is not None and bool(batch.claims)


# The directories' names: this prefix, the main process's pid, a dash, random letters.
DIRECTORY_PREFIX = "task-console-claims-"


def prepare() -> None:
    """In the worker's main process, before it starts its pool: make the directory its
    pool processes record into, and remove those left by main processes that are gone
    (killed without stopping: their leases ran out meanwhile)."""
    global _directory
    with contextlib.suppress(OSError):
        for old in parent().glob(f"{DIRECTORY_PREFIX}*-*"):
            pid = old.name.removeprefix(DIRECTORY_PREFIX).split("-", 1)[0]
            mine = not old.is_symlink() and old.stat().st_uid == os.getuid()
            if mine and pid.isdigit() and not process_running(int(pid)):
                shutil.rmtree(old, ignore_errors=True)
    name = f"{DIRECTORY_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    _directory = ClaimsDirectory(parent() / name)
    # Without it the worker runs all the same (a dead pool process's leases run out
    # instead); the watcher keeps trying, and says so.
    _directory.ensure()


def watch() -> None:
    """In the worker's main process, once its pool runs: hand back what a pool process held
    as soon as it dies (:class:`ChildWatcher`)."""
    global _watcher
    if _directory is not None and _watcher is None:
        _watcher = ChildWatcher(_directory.path, _directory)
        _watcher.start()


def clean_up() -> None:
    """In the worker's main process, once it stops: stop watching, remove the records."""
    global _directory, _watcher
    if _watcher is not None:
        _watcher.stop()
    if _directory is not None:
        shutil.rmtree(_directory.path, ignore_errors=True)
        if _directory.off is not None:
            claims_directory.report_off(None)
    _directory = _watcher = None


def start_recording() -> None:
    """In a pool process, once it starts: record into a file of its own, if its main
    process made the directory."""
    if _directory is not None and _directory.usable():
        try:
            record.open(_directory.path / str(os.getpid()))
        except OSError as exc:
            logger.warning("not recording this process's claims (%s)", exc)


def stop_recording() -> None:
    """In a pool process that exits of its own accord: nothing is left to hand back."""
    if record.is_open and _directory is not None:
        record.close()
        (_directory.path / str(os.getpid())).unlink(missing_ok=True)


class ChildWatcher(threading.Thread):
    """A thread of the worker's main process that finds pool processes that died (a file
    in the directory whose process exited) and hands back what each held, so the main
    process's event loop never waits on the database."""

    def __init__(self, directory: Path, kept: ClaimsDirectory | None = None) -> None:
        super().__init__(name="claims-watcher", daemon=True)
        self.directory = directory
        # Checked (and made again) before each look; None: taken as it is.
        self.kept = kept
        self._stopped = threading.Event()
        self._failing = False

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        while not self._stopped.wait(WATCH_SECONDS):
            self.look()

    def look(self) -> None:
        """Hand back what each pool process that died held; one line when looking fails,
        not one every look."""
        try:
            if self.kept is not None and not self.kept.ensure():
                return
            for pid in self.exited():
                recover(pid, self.directory / str(pid))
        except Exception:
            if not self._failing:
                logger.exception("could not look for pool processes that died")
            self._failing = True
        else:
            self._failing = False

    def exited(self) -> list[int]:
        """The pool processes with a record here that have exited."""
        pids = [int(name) for name in os.listdir(self.directory) if name.isdigit()]
        return [pid for pid in pids if has_exited(pid)]


def has_exited(pid: int) -> bool:
    """Whether this process's child ``pid`` has exited, without reaping it (the pool does)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # reaped already


def recover(pid: int, path: Path) -> Recovery | None:
    """Hand back what the dead pool process ``pid`` recorded in ``path``, and remove the
    record; None when it held nothing."""
    try:
        batch = read_batch(path)
        if batch is not None and batch.claims:
            _telling.append(pid)
        path.unlink(missing_ok=True)
        if batch is None or not batch.claims:
            return None
        done = hand_back(batch, actor=f"worker:{socket.gethostname()}:{os.getpid()}")
        culprit = batch.culprit
        running = f"running step {culprit.step_id}" if culprit else "between steps"
        logger.warning(
            "pool process %d died %s; released %d claim(s) of its batch of %d without "
            "charging them%s",
            pid,
            running,
            done.released,
            len(batch.claims),
            ", and ended the running step's lease now" if done.expired else "",
        )
        return done
    except Exception:
        logger.exception("could not hand back the claims of pool process %d", pid)
        return None
    finally:
        connections.close_all()
