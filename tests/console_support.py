"""Helpers for the tests of the console and the commands: logged-in clients, a page's text,
and the dead letters' bulk form previewed and confirmed as its two buttons do. The tasks
pages and commands act on are built by ``tests.factories``."""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from django.contrib.auth.models import User
from django.http.response import HttpResponseBase
from django.test import Client

HTMX = {"HX-Request": "true"}


def login(user: User, **client_options: Any) -> Client:
    client = Client(**client_options)
    client.force_login(user)
    return client


def body(response: HttpResponseBase) -> str:
    content: bytes = response.content  # type: ignore[attr-defined]
    return content.decode()


# --- the dead letters' bulk form ------------------------------------------------------------

PLAN = re.compile(r'name="plan" value="([^"]+)"')


def post_bulk(client: Client, **fields: str) -> HttpResponseBase:
    data = {"action": "redrive", "reason": "remote fixed", **fields}
    return client.post("/dead/bulk/", data, headers=HTMX)


def plan_of(response: HttpResponseBase) -> str:
    found = PLAN.search(body(response))
    assert found, body(response)[:2000]
    return found.group(1)


def confirm_bulk(client: Client, **fields: str) -> HttpResponseBase:
    """Preview, then confirm the plan the preview made, as the page's two buttons do."""
    preview = post_bulk(client, **fields)
    assert preview.status_code == 200, body(preview)[:2000]
    return post_bulk(client, **fields, confirm="1", plan=plan_of(preview))


def export_rows(client: Client, **filters: str) -> list[list[str]]:
    """The export's header and event rows; its last row, the audit chain's head, is
    checked and left out."""
    export = client.get("/audit/export.csv", filters)
    assert export.status_code == 200 and export["Content-Type"].startswith("text/csv")
    content = b"".join(export.streaming_content)  # type: ignore[attr-defined]
    *rows, head = csv.reader(io.StringIO(content.decode()))
    assert head[0].startswith("# chain head: ") and len(head) == len(rows[0])
    return rows
