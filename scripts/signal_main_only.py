"""Run a command in a process group of its own and hand SIGTERM and SIGINT to it alone.

``make run``'s honcho stops each process by signalling its whole process group. For a
Celery worker that group holds the pool's child processes too: they die on the SIGTERM
meant for the main process, the worker logs each as an ERROR and its warm shutdown waits
on them until honcho kills it. Run under this (Procfile.dev), only the worker's main
process gets the signal, and it stops its pool itself: a warm shutdown.

On Linux the command is also sent SIGTERM should this process die first (killed outright),
so it is never left running without the process honcho watches.

    python scripts/signal_main_only.py COMMAND [ARG ...]
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from types import FrameType

FORWARDED = (signal.SIGTERM, signal.SIGINT)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before it runs the command: SIGTERM when this process dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    linux = sys.platform.startswith("linux")
    child = subprocess.Popen(  # noqa: S603 - the command is the caller's, as with exec
        argv,
        start_new_session=True,
        preexec_fn=_die_with_parent if linux else None,
    )

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    # The wait resumes after each forwarded signal (PEP 475) until the command exits.
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
