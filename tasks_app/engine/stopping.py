"""Whether this worker is stopping: told by its main process to its pool processes.

A warm shutdown (SIGTERM to a Celery worker's main process, as ``systemctl stop`` sends
it with ``KillMode=mixed``) stops the worker taking messages and waits for its pool
processes to finish what they run; they themselves get no signal. A pool process in the
middle of a drain (``runner.drain``) would go on claiming batch after batch for up to
``TASKS_DRAIN_SECONDS``, and work through the rest of a batch of up to
``TASKS_CLAIM_BATCH`` steps, keeping the worker up and its host's next process waiting. So
the main process raises a flag its pool processes share (one byte of memory mapped
before they are forked, inherited by every pool process, also those forked later), and
a pool process reads it before each claim and each step: once it is up it claims
nothing, finishes the step it is running, and hands back, uncharged, the steps it holds
but has not started (``runner.run_batch``).
"""

from __future__ import annotations

import mmap

# One byte shared by the main process and its pool processes; None until ``prepare`` (a
# process that is no worker's: never stopping).
_flag: mmap.mmap | None = None


def prepare() -> None:
    """In the worker's main process, before it forks its pool."""
    global _flag
    if _flag is None:
        # Anonymous and shared (mmap's default flags): a forked child sees the parent's
        # later writes.
        _flag = mmap.mmap(-1, 1)
    _flag[0] = 0


def begin() -> None:
    """In the worker's main process, once its warm shutdown begins."""
    if _flag is not None:
        _flag[0] = 1


def is_stopping() -> bool:
    return _flag is not None and _flag[0] == 1
