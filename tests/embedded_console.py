"""The console's permission tables checked on the embedded default (SQLite), run as a
script in a subprocess by tests/project/test_e2e_embedded.py: ``python -m tests.embedded_console``.

Each page and action is tried for each role inside a transaction rolled back afterwards,
so every case starts from the same world. Prints one JSON line per case.
"""

from __future__ import annotations

import json
import os
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from django.db import connection, transaction  # noqa: E402

from tests.approval_support import advance, article, pending_request  # noqa: E402
from tests.conftest import _user  # noqa: E402
from tests.console_support import login  # noqa: E402
from tests.factories import dead_task  # noqa: E402
from tests.limits_page_support import limited_flow  # noqa: E402
from tests.permission_tables import (  # noqa: E402
    ACTION_CASES,
    PAGE_CASES,
    page_url,
    post_action,
    prepare,
)
from tests.rows import action_rows  # noqa: E402


class Rollback(Exception):
    pass


def main() -> None:
    assert connection.vendor == "sqlite", connection.vendor
    users = {
        "editor": _user("edith-editor", "editors"),
        "oncall": _user("olivia-oncall", "oncall"),
        "auditor": _user("aaron-auditor", "auditors"),
        "admin": _user("sam-super", superuser=True),
        "outsider": _user("otto-outsider"),
    }
    author = _user("ava-author", "editors")
    world: dict[str, Any] = {
        "dead": dead_task(),
        "review": pending_request(advance(article(actor=author))),
    }
    with limited_flow():
        try_all(users, world)


def try_all(users: dict[str, Any], world: dict[str, Any]) -> None:
    for page, role, _ in PAGE_CASES:
        status = login(users[role]).get(page_url(page, world)).status_code
        print(json.dumps(["page", page, role, str(status)]))
    for action, role, _ in ACTION_CASES:
        print(json.dumps(["action", action, role, try_action(action, users[role], world)]))


def try_action(action: str, user: Any, world: dict[str, Any]) -> str:
    outcome = "?"
    try:
        with transaction.atomic():
            prepare(action)
            before = action_rows()
            response = post_action(login(user), action, world)
            if response.status_code == 302 and action_rows() != before:
                outcome = "done"
            elif response.status_code == 403 and action_rows() == before:
                outcome = "403"
            else:
                outcome = f"unexpected {response.status_code}"
            raise Rollback
    except Rollback:
        pass
    return outcome


if __name__ == "__main__":
    main()
