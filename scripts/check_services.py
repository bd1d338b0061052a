"""Exit non-zero, saying which, when DATABASE_URL or REDIS_URL cannot be reached."""

from __future__ import annotations

import os
import sys

import dj_database_url
import psycopg
import redis


def main() -> int:
    ok = True
    db = dj_database_url.parse(os.environ["DATABASE_URL"])
    try:
        # The maintenance database: the test database is created by the test run itself.
        psycopg.connect(
            dbname="postgres",
            user=db.get("USER") or None,
            password=db.get("PASSWORD") or None,
            host=db.get("HOST") or None,
            port=db.get("PORT") or None,
            connect_timeout=3,
        ).close()
    except psycopg.Error as exc:
        print(
            f"PostgreSQL at {db.get('HOST')}:{db.get('PORT')} is unreachable: {exc}",
            file=sys.stderr,
        )
        ok = False
    try:
        redis.Redis.from_url(os.environ["REDIS_URL"], socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        print(f"Redis at {os.environ['REDIS_URL']} is unreachable: {exc}", file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
