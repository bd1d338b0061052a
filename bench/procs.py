"""Processes the harness starts: each in a session of its own (so a whole prefork pool is
one process group), logging to a file, registered until stopped, and stopped with SIGTERM
then SIGKILL of the group, also when the harness fails half-way. Memory is read from
/proc."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.common import ROOT

# Every group not yet stopped; the harness's finally stops what is left.
_LIVE: list[ProcessGroup] = []


class ProcessGroup:
    """Some processes of one system (a Celery main process with its pool, or N worker
    processes), with a ready folder each of them drops a file into once it can work."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name = name
        self.folder = folder
        self.ready_dir = folder / "ready"
        self.ready_dir.mkdir(parents=True, exist_ok=True)
        self.processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[Path] = []
        _LIVE.append(self)

    def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        log_path = self.folder / f"{self.name}-{len(self.processes)}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(  # noqa: S603 (the harness's own commands)
                list(argv),
                cwd=ROOT,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        self._logs.append(log_path)
        return process

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def ready_count(self) -> int:
        return len(list(self.ready_dir.glob("*.ready")))

    def exited(self) -> list[int]:
        return [p.pid for p in self.processes if p.poll() is not None]

    def wait_ready(self, expected: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.ready_count() < expected:
            dead = self.exited()
            if dead:
                raise RuntimeError(f"{self.name}: process {dead} exited early\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: not ready after {timeout:g}s\n{self.tail()}")
            time.sleep(0.02)

    def tail(self, lines: int = 30) -> str:
        out = []
        for path in self._logs:
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)

    def log_text(self) -> str:
        parts = []
        for path in self._logs:
            with contextlib.suppress(OSError):
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)

    def stop(self, timeout: float = 20.0) -> float:
        """SIGTERM every leader (a Celery worker then stops its pool), wait for them, then
        SIGKILL whatever is left of each group. Returns how long the leaders took to exit
        (``timeout`` when one had to be killed)."""
        began = time.monotonic()
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        took = time.monotonic() - began
        for process in self.processes:
            # The group outlives its leader when pool children linger: kill it either way.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        if self in _LIVE:
            _LIVE.remove(self)
        return took


def stop_all() -> None:
    for group in list(_LIVE):
        with contextlib.suppress(Exception):
            group.stop(timeout=10)


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: split after it.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry.name))
    return sorted(found)


def memory_kib(pid: int) -> dict[str, int]:
    """Resident (RSS), proportional (PSS) and private (USS) memory of ``pid`` in KiB."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out["rss"] = int(line.split()[1])
    with contextlib.suppress(OSError):
        private = 0
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            parts = line.split()
            if parts[0] == "Pss:":
                out["pss"] = int(parts[1])
            elif parts[0] in {"Private_Clean:", "Private_Dirty:"}:
                private += int(parts[1])
        out["uss"] = private
    return out


_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User plus system CPU time of each of ``pids`` still running, in seconds."""
    out: dict[int, float] = {}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        out[pid] = (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
    return out


def named(name: str) -> list[int]:
    """Processes whose command is ``name`` (a PostgreSQL server on this machine)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
    return found


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two readings by the processes of the second (a process
    started in between counts from zero)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())
