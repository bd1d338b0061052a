"""The queues page: each queue's depth and state, paused and resumed with a reason."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from tests.console_support import HTMX, body, login
from tests.factories import enqueued

pytestmark = pytest.mark.django_db


def test_queues_show_depth_and_pause_and_resume_with_a_reason(oncall: User) -> None:
    enqueued()
    client = login(oncall)
    page = body(client.get("/queues/"))
    assert re.search(r"<th scope=\"row\"><a [^>]+>default</a></th>\s*<td>.*running", page)
    response = client.post("/queues/default/pause/", {"reason": "failover"}, headers=HTMX)
    assert response.status_code == 200 and "paused" in body(response)
    assert "failover" in body(response)
    assert ">Resume</button>" in body(response)
    unknown = client.post("/queues/nope/pause/", {"reason": "x"}, headers=HTMX)
    assert unknown.status_code == 400 and "Queue nope" in body(unknown)
