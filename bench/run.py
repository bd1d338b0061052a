"""``python -m bench.run --mode quick|full``: the entry point of ``make bench-quick`` and
``make bench``. The harness is ``bench/cli.py``; this module only runs it and turns an
interruption (SIGTERM, or the last-resort alarm) into exit status 143 once everything it
started is cleaned up."""

from __future__ import annotations

import sys

from bench.cli import Interrupted, main

if __name__ == "__main__":
    try:
        sys.exit(main())
    except Interrupted as exc:
        print(
            f"bench: interrupted ({exc}); processes, database and keys cleaned up", file=sys.stderr
        )
        sys.exit(143)
