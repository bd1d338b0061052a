"""The check that no migration locks a big table: every statement a migration runs, judged
by what PostgreSQL does with it.

:func:`capture` migrates a scratch database from nothing to the latest migration and
back, in a process of its own, and records every statement each migration ran (Django's
operations, ``RunSQL`` and what ``RunPython`` executes alike). :func:`findings` reads
them. On a big table (``BIG_TABLES``) that the migration neither creates nor drops:

1. an index is built and dropped ``CONCURRENTLY`` (a plain build stops every write to the
   table until it ends, and every transition writes an event);
2. a foreign key or check constraint is added ``NOT VALID`` (then validated, a scan that
   blocks no writes), a unique or primary key constraint ``USING INDEX`` an index built
   concurrently;
3. nothing rewrites or scans the table under its lock: no column type change, no
   ``SET NOT NULL``, no column added with a foreign key, a unique or generated value or a
   volatile default, no ``CLUSTER``, ``VACUUM FULL``, plain ``REINDEX`` or ``LOCK TABLE``;
4. every other statement that locks the table (any ``ALTER TABLE``, a trigger, a foreign
   key pointing at it) runs under a ``lock_timeout`` no longer than half the workers'
   own, so that a worker queued behind it never gives up.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlparse

from tests.e2e_support import PYTHON, ROOT

BIG_TABLES = (
    "tasks_app_task",
    "tasks_app_step",
    "tasks_app_lease",
    "tasks_app_event",
    "tasks_app_effect",
    "approvals_approvalrequest",
)


@dataclass(frozen=True)
class Captured:
    """One statement a migration ran (``label``: ``app.name``, with ``(backwards)``)."""

    label: str
    sql: str


CAPTURE = r"""
import json
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

ran = []
running = []

def progress(action, migration=None, fake=False):
    if action in ("apply_start", "unapply_start"):
        back = " (backwards)" if action == "unapply_start" else ""
        running[:] = [f"{migration.app_label}.{migration.name}{back}"]
    elif action in ("apply_success", "unapply_success"):
        running.clear()

def record(execute, sql, params, many, context):
    if running:
        ran.append([running[0], sql])
    return execute(sql, params, many, context)

with connection.execute_wrapper(record):
    forwards = MigrationExecutor(connection, progress)
    forwards.migrate(forwards.loader.graph.leaf_nodes())
    backwards = MigrationExecutor(connection, progress)
    backwards.migrate([("tasks_app", None)])
print("CAPTURED " + json.dumps(ran))
"""


def capture(database_url: str, env: Mapping[str, str] | None = None) -> list[Captured]:
    """Migrate the empty database at ``database_url`` to the latest migration and back
    (``tasks_app`` and what depends on it), in a ``manage.py`` process of its own;
    return every statement each migration ran, in order."""
    done = subprocess.run(
        [PYTHON, "manage.py", "shell", "-v", "0", "-c", CAPTURE],
        cwd=ROOT,
        env={**os.environ, **(env or {}), "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("CAPTURED ")]
    if done.returncode != 0 or not lines:
        raise AssertionError(f"migrating failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return [Captured(label, sql) for label, sql in json.loads(lines[0][len("CAPTURED ") :])]


# --- reading the statements -----------------------------------------------------------------

NAME = r'(?:"(?:[^"]|"")+"|[a-z_][a-z0-9_$]*)'
CREATE_INDEX = re.compile(
    rf"^CREATE (UNIQUE )?INDEX (CONCURRENTLY )?(IF NOT EXISTS )?({NAME}) ON (ONLY )?({NAME})", re.I
)
DROP_INDEX = re.compile(rf"^DROP INDEX (CONCURRENTLY )?(IF EXISTS )?({NAME})", re.I)
CREATE_OR_DROP_TABLE = re.compile(rf"^(?:CREATE|DROP) TABLE (?:IF (?:NOT )?EXISTS )?({NAME})", re.I)
ALTER_TABLE = re.compile(rf"^ALTER TABLE (IF EXISTS )?(ONLY )?({NAME})", re.I)
LOCK_TIMEOUT = re.compile(
    r"^(?:SET (?:SESSION |LOCAL )?lock_timeout\s*(?:=|TO)\s*'?([^';]+)'?"
    r"|SELECT set_config\('lock_timeout', '([^']+)'"
    r"|(RESET lock_timeout))",
    re.I,
)
# Table-wide locks that are not held long (the concurrent forms take none that stops
# writes): these need no lock timeout of their own.
BLOCKS_NO_WRITES = re.compile(
    r"^(CREATE (UNIQUE )?INDEX CONCURRENTLY|DROP INDEX CONCURRENTLY|REINDEX .*CONCURRENTLY"
    r"|ALTER TABLE .* VALIDATE CONSTRAINT|SELECT|INSERT|UPDATE|DELETE|WITH|SHOW|SET|RESET"
    r"|BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)\b",
    re.I,
)
REWRITES_OR_SCANS = (
    (re.compile(r"\bALTER COLUMN \S+ (SET DATA )?TYPE\b", re.I), "changes a column's type"),
    (re.compile(r"\bALTER COLUMN \S+ SET NOT NULL\b", re.I), "sets NOT NULL (a full scan)"),
    (
        re.compile(
            r"\bADD COLUMN\b.*\b(REFERENCES|PRIMARY KEY|UNIQUE|SERIAL|BIGSERIAL|SMALLSERIAL"
            r"|GENERATED ALWAYS AS .* STORED)\b",
            re.I,
        ),
        "adds a column with a foreign key, a unique or a generated value",
    ),
    (
        re.compile(
            r"\bADD COLUMN\b.*\bDEFAULT\b.*\b(random|clock_timestamp|timeofday"
            r"|gen_random_uuid|uuid_generate_v\d\w*|nextval)\s*\(",
            re.I,
        ),
        "adds a column with a volatile default (a rewrite)",
    ),
    (re.compile(r"\bSET (TABLESPACE|LOGGED|UNLOGGED)\b", re.I), "rewrites the table"),
    (re.compile(r"^(CLUSTER|VACUUM FULL|LOCK TABLE)\b", re.I), "locks the table for its run"),
    (re.compile(r"^REINDEX\b(?!.*CONCURRENTLY)", re.I), "reindexes without CONCURRENTLY"),
    (
        re.compile(r"\bADD (CONSTRAINT \S+ )?(FOREIGN KEY|CHECK)\b(?!.*\bNOT VALID\b)", re.I),
        "adds a constraint without NOT VALID (every row checked under its lock)",
    ),
    (
        re.compile(
            r"\bADD (CONSTRAINT \S+ )?(UNIQUE|PRIMARY KEY|EXCLUDE)\b(?!.*\bUSING INDEX\b)", re.I
        ),
        "adds a unique constraint that builds its index under the lock (USING INDEX)",
    ),
)


def existing_indexes(connection: Any) -> dict[str, str]:
    """The table of each index in ``connection``'s database now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, tablename FROM pg_indexes WHERE schemaname = 'public'")
        return dict(cursor.fetchall())


def _unquote(name: str) -> str:
    return name[1:-1].replace('""', '"') if name.startswith('"') else name.lower()


def _statements(sql: str) -> Iterable[str]:
    for part in sqlparse.split(sql):
        text = sqlparse.format(part, strip_comments=True).strip().rstrip(";").strip()
        if text:
            yield " ".join(text.split())


def _milliseconds(value: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|min)?\s*", value, re.I)
    if not match:
        raise ValueError(f"unreadable lock_timeout {value!r}")
    unit = (match.group(2) or "ms").lower()
    return int(match.group(1)) * {"ms": 1, "s": 1000, "min": 60_000}[unit]


def _named_tables(statement: str, index_tables: Mapping[str, str]) -> set[str]:
    named = {
        table
        for table in BIG_TABLES
        if re.search(rf'(?<![\w$"]){table}(?![\w$"])|"{table}"', statement)
    }
    if drop := DROP_INDEX.match(statement):
        index = _unquote(drop.group(3))
        if index in index_tables:
            named.add(index_tables[index])
    return named


def findings(
    captured: Sequence[Captured],
    *,
    session_lock_timeout_ms: int,
    workers_lock_timeout_ms: int,
    indexes: Mapping[str, str] | None = None,
) -> list[str]:
    """What in ``captured`` would hold a big table's lock long, or wait for it without a
    short lock timeout (see the module); an empty list when nothing. ``indexes`` names
    the table of each index that existed before (those ``captured`` creates are known)."""
    found: list[str] = []
    lock_timeout = session_lock_timeout_ms
    longest_wait = workers_lock_timeout_ms // 2
    index_tables: dict[str, str] = dict(indexes or {})
    # A table the migration creates or drops holds no rows anyone is waiting for.
    new_or_gone: dict[str, set[str]] = {}
    for item in captured:
        for statement in _statements(item.sql):
            if table := CREATE_OR_DROP_TABLE.match(statement):
                new_or_gone.setdefault(item.label, set()).add(_unquote(table.group(1)))
    for item in captured:
        new_tables = new_or_gone.get(item.label, set())
        for statement in _statements(item.sql):
            if setting := LOCK_TIMEOUT.match(statement):
                value = setting.group(1) or setting.group(2)
                lock_timeout = session_lock_timeout_ms if value is None else _milliseconds(value)
                continue
            if index := CREATE_INDEX.match(statement):
                index_tables[_unquote(index.group(4))] = _unquote(index.group(6))
            locked = _named_tables(statement, index_tables) - new_tables
            if not locked:
                continue
            problems = []
            if index and not index.group(2):
                problems.append("builds an index without CONCURRENTLY")
            if (drop := DROP_INDEX.match(statement)) and not drop.group(1):
                problems.append("drops an index without CONCURRENTLY")
            altered = ALTER_TABLE.match(statement)
            if not altered or _unquote(altered.group(3)) in locked:
                problems += [
                    what for pattern, what in REWRITES_OR_SCANS if pattern.search(statement)
                ]
            if not BLOCKS_NO_WRITES.match(statement) and not 0 < lock_timeout <= longest_wait:
                problems.append(
                    f"waits for its lock up to {lock_timeout or 'no limit'} ms "
                    f"(at most {longest_wait} ms: workers queue behind it)"
                )
            found += [
                f"{item.label}: {problem} on {', '.join(sorted(locked))}: {statement[:160]}"
                for problem in problems
            ]
    return found
