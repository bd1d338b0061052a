"""What the harness reads from its servers: the PostgreSQL and Redis settings a run
records, and around a drain the bench database's commits and the WAL it wrote.

The bench database is read from outside it, through the maintenance connection, so that
reading adds no commit to what is counted; the harness's own connection to it counts its
statements so they can be taken out.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import psycopg
import redis

from bench.common import scalar, wait_for

POSTGRES_SETTINGS = (
    "server_version",
    "shared_buffers",
    "synchronous_commit",
    "fsync",
    "wal_level",
    "max_connections",
    "full_page_writes",
    "checkpoint_timeout",
    "max_wal_size",
)
REDIS_SETTINGS = (
    "maxmemory",
    "maxmemory-policy",
    "appendonly",
    "appendfsync",
    "save",
    "io-threads",
    "hz",
)


class ServerStats:
    """The bench database's counters and WAL, read through the maintenance connection
    (to another database of the same server); created once the bench database exists."""

    def __init__(self, conn: psycopg.Connection[Any], db_name: str, *, walinspect: bool) -> None:
        self.conn = conn
        self.db_name = db_name
        self.walinspect = walinspect  # whether pg_walinspect is installed in it
        self.can_checkpoint = True
        self.wal_error = ""
        self.oid = int(scalar(conn, "SELECT oid FROM pg_database WHERE datname = %s", db_name))

    def backends(self) -> int:
        return int(
            scalar(
                self.conn,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                " AND backend_type = 'client backend'",
                self.db_name,
            )
        )

    def quiesce(self, timeout: float = 30) -> None:
        """Wait until no client is connected to the bench database, then a moment more:
        a backend writes its statistics as it exits, just after it leaves the list."""
        wait_for(lambda: self.backends() == 0, timeout=timeout, what="bench database clients")
        time.sleep(0.3)

    def checkpoint(self) -> None:
        """A checkpoint before each measured drain, so every system starts from the same
        full-page-write state (WAL per step is otherwise a matter of luck)."""
        if not self.can_checkpoint:
            return
        try:
            self.conn.execute("CHECKPOINT")
        except psycopg.Error:
            self.can_checkpoint = False

    def counters(self) -> dict[str, Any]:
        # The server's statistics are read afresh (a transaction would keep one snapshot).
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self.conn.execute(
            "SELECT xact_commit, xact_rollback, pg_current_wal_lsn()::text,"
            " tup_inserted + tup_updated + tup_deleted"
            " FROM pg_stat_database WHERE datname = %s",
            (self.db_name,),
        ).fetchone()
        assert row is not None
        return {
            "commits": int(row[0]),
            "rollbacks": int(row[1]),
            "lsn": row[2],
            # Row versions written: each insert, update (heap-only or not) and delete.
            "row_writes": int(row[3]),
        }

    def table_writes(self, dsn: str) -> dict[str, int]:
        """Row versions written so far to each table of the bench database (inserts,
        updates, deletes). Read through a connection of its own to that database, so it is
        called before the window's first reading and after its last: its transaction is
        outside what is counted."""
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            rows = conn.execute(
                "SELECT relname, n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables"
            ).fetchall()
        return {str(name): int(writes) for name, writes in rows}

    def wal_bytes(self, before: str, after: str) -> int:
        return int(
            scalar(self.conn, "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", after, before)
        )

    def own_wal_bytes(self, dsn: str, before: str, after: str) -> int | None:
        """The WAL written for the bench database alone: records touching its relations
        and the commit records of their transactions (pg_walinspect, when it could be
        installed). The LSN difference counts the whole cluster, other databases too."""
        if not self.walinspect:
            return None
        # pg_walinspect reads only flushed WAL; the wal writer gets there within moments.
        with contextlib.suppress(TimeoutError):
            wait_for(
                lambda: scalar(self.conn, "SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", after),
                timeout=5,
                what="the WAL flush",
            )
        sql = """
            WITH r AS (
                SELECT xid, record_length, block_ref
                FROM pg_get_wal_records_info(%(before)s::pg_lsn, %(after)s::pg_lsn)
            ),
            mine AS (SELECT DISTINCT xid FROM r WHERE block_ref LIKE %(rel)s AND xid <> 0)
            SELECT coalesce(sum(record_length), 0) FROM r
            WHERE block_ref LIKE %(rel)s OR (xid <> 0 AND xid IN (SELECT xid FROM mine))
        """
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
                conn.execute("SET statement_timeout = '60s'")
                row = conn.execute(
                    sql, {"before": before, "after": after, "rel": f"%rel %/{self.oid}/%"}
                ).fetchone()
        except psycopg.Error as exc:
            self.wal_error = str(exc).strip()[:300]
            return None
        self.wal_error = ""
        return int(row[0]) if row else None

    def postgres_settings(self) -> dict[str, str]:
        rows = self.conn.execute(
            "SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name",
            (list(POSTGRES_SETTINGS),),
        ).fetchall()
        return {str(name): str(value) for name, value in rows}


def table_persistence(conn: psycopg.Connection[Any], tables: list[str]) -> dict[str, list[str]]:
    """The tables by persistence as the catalog has them: "logged", "unlogged" (no WAL,
    emptied after a crash), "missing"."""
    out: dict[str, list[str]] = {}
    kinds = {"p": "logged", "u": "unlogged", "t": "temporary"}
    for table in tables:
        kind = scalar(
            conn, "SELECT relpersistence FROM pg_class WHERE oid = to_regclass(%s)", table
        )
        out.setdefault(kinds.get(str(kind), "missing") if kind else "missing", []).append(table)
    return out


class CountingConnection(psycopg.Connection[Any]):
    """The harness's observer connection, counting its statements (each one a commit in
    autocommit mode) so they can be taken out of the bench database's commit count."""

    statements = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.statements += 1
        return super().execute(*args, **kwargs)


def redis_version(rds: redis.Redis) -> str:
    info: dict[str, Any] = {}
    with contextlib.suppress(redis.RedisError):
        info = rds.info("server")  # type: ignore[assignment]
    return str(info.get("redis_version", "?"))


def redis_settings(rds: redis.Redis) -> dict[str, str]:
    settings: dict[str, str] = {}
    for name in REDIS_SETTINGS:
        try:
            value = rds.config_get(name)
            settings[name] = str(value.get(name, "?"))  # type: ignore[union-attr]
        except redis.RedisError:
            settings[name] = "(CONFIG GET refused)"
    return settings
