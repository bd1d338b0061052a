"""The console cells (6. in docs/performance.md, "How it is measured"): the time to render
a console page over a small and a large history, each a database of its own built by the
first console cell of a harness run (``bench/dataset.py``), each page timed in a process of
its own per size (``bench/pages.py``)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench import dataset
from bench.cells import Mode
from bench.common import ROOT
from bench.databases import CONSOLE_DB, Server, migrate, with_database
from bench.pages import PAGES, BadAnswer, PageProcess
from bench.systems import Ctx

CONSOLE_PAGES = tuple(PAGES)


class Console:
    """The console cells of a harness run: their data sets, built by the first cell and
    kept for the rest of the run, and one page timed over them."""

    def __init__(self, ctx: Ctx, server: Server, mode: Mode) -> None:
        self.ctx = ctx
        self.server = server
        self.mode = mode
        self.dsns: dict[int, str] = {}  # tasks -> DSN
        self.data: dict[str, Any] = {}  # what each build wrote and took, for the results
        self.failure: str | None = None

    def build(self) -> None:
        """Each size's database: created, migrated, filled with COPY, analyzed, checked.
        Built once per harness run; a failure is remembered so later cells fail at once."""
        if self.failure is not None:
            raise RuntimeError(f"the console data could not be built: {self.failure}")
        if self.dsns:
            return
        try:
            for tasks in self.mode.console_sizes:
                name = CONSOLE_DB.format(tasks)
                began = time.monotonic()
                self.server.create_other(name)
                dsn = with_database(self.ctx.dsn, name)
                migrated = migrate(self.ctx.python, self.ctx.env, dsn)
                info = dataset.load(dsn, tasks)
                info.update(
                    {"database": name, "migrate_s": migrated, "build_s": time.monotonic() - began}
                )
                self.data[str(tasks)] = info
                self.dsns[tasks] = dsn
                print(
                    f"console data: {tasks:,} tasks in {name}, built in {info['build_s']:.1f} s "
                    f"({info['database_mib']:,.0f} MiB)",
                    flush=True,
                )
        except Exception as exc:
            self.dsns = {}
            self.failure = f"{type(exc).__name__}: {exc}".strip().splitlines()[-1][:500]
            raise

    def page(self, page: str) -> dict[str, Any]:
        """One page timed over both data sets: a ``bench.pages`` process per set, warmed
        up, then the GETs alternate between the two (which goes first alternates too), so
        the machine's moments of load fall on both sizes alike."""
        mode, ctx = self.mode, self.ctx
        self.build()
        sizes = mode.console_sizes
        procs: dict[int, PageProcess] = {}
        out: dict[str, Any] = {}
        try:
            for tasks in sizes:
                env = {**ctx.env, "DATABASE_URL": self.dsns[tasks]}
                env["BENCH_DSN"] = env["DATABASE_URL"]
                procs[tasks] = PageProcess(
                    ctx.python,
                    page,
                    env=env,
                    cwd=ROOT,
                    log=ctx.work_dir / f"page-{page}-{tasks}-{time.monotonic_ns()}.log",
                    warmup=mode.console_warmup,
                )
            for tasks, proc in procs.items():
                self._ask(proc, tasks, None, timeout=120)  # booted and warmed up
            times: dict[int, list[float]] = {tasks: [] for tasks in sizes}
            size_bytes: dict[int, int] = {}
            for round_ in range(mode.console_gets):
                for tasks in sizes if round_ % 2 == 0 else sizes[::-1]:
                    reply = self._ask(procs[tasks], tasks, "get", timeout=60)
                    times[tasks].append(float(reply["ms"]))
                    size_bytes[tasks] = int(reply["bytes"])
            for tasks in sizes:
                queries = self._ask(procs[tasks], tasks, "explain", timeout=120)
                out[str(tasks)] = {
                    "median_ms": statistics.median(times[tasks]),
                    "min_ms": min(times[tasks]),
                    "max_ms": max(times[tasks]),
                    "times_ms": times[tasks],
                    "bytes": size_bytes[tasks],
                    **queries,
                }
        finally:
            for proc in procs.values():
                proc.stop()
        small, large = sizes
        small_ms, large_ms = out[str(small)]["median_ms"], out[str(large)]["median_ms"]
        return {
            "page": page,
            "url": PAGES[page],
            "small": small,
            "large": large,
            "small_ms": small_ms,
            "large_ms": large_ms,
            "ratio": large_ms / small_ms,
            "sizes": out,
        }

    @staticmethod
    def _ask(proc: PageProcess, tasks: int, command: str | None, timeout: float) -> dict[str, Any]:
        try:
            return proc.ask(command, timeout)
        except BadAnswer as exc:
            # The process's log (a 500's traceback) first, the answer on the last line.
            raise RuntimeError(f"{proc.tail(3000)}\nat {tasks:,} tasks: {exc}") from None
