"""The demo seed's first run, on an empty database: the demo users, each new password
printed and kept in a file only its owner reads (none in production mode), the tasks made
once. (tests/project/test_seed_demo.py reads what the seed leaves, seeded once.)"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.http import HttpRequest
from django.test import Client

from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app.management.commands import seed_demo
from tasks_app.management.commands.demo_users import DEMO_USERS, demo_address, read_passwords
from tasks_app.models import StepStatus, Task, TaskStatus
from tests.conftest import ensure_groups
from tests.seed_support import seed
from tests.seed_support import var_dir as var_dir  # a fixture, for pytest to find

pytestmark = pytest.mark.django_db


def test_it_keeps_each_new_password_in_a_file_only_its_owner_reads(var_dir: Path) -> None:
    out = seed()
    path = var_dir / "demo-users.txt"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    passwords = read_passwords()
    assert set(passwords) == set(DEMO_USERS)
    for username, password in passwords.items():
        assert User.objects.get(username=username).check_password(password)
        assert f"password: {password}" in out


def test_it_keeps_no_password_file_in_production_mode(var_dir: Path, settings: Any) -> None:
    settings.PRODUCTION = True
    out = seed()
    assert out.count("password:") == len(DEMO_USERS)
    assert not (var_dir / "demo-users.txt").exists()


def test_the_demo_seed_creates_users_in_their_groups_and_tasks_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ensure_groups()  # a transactional test before this one may have flushed them
    call_command("seed_demo")
    first = capsys.readouterr().out
    call_command("seed_demo")
    second = capsys.readouterr().out
    assert first.count("password:") == len(DEMO_USERS)
    assert "password:" not in second
    assert User.objects.get(username="oncall").groups.filter(name="oncall").exists()
    assert User.objects.get(username="auditor").groups.filter(name="auditors").exists()
    assert User.objects.get(username="admin").is_superuser
    # Two editors for a press release's quorum, a senior one for its escalation, each with
    # an address for the demo's mail.
    senior = User.objects.get(username="senior")
    assert senior.groups.filter(name="senior_editors").exists()
    assert User.objects.get(username="editor2").groups.filter(name="editors").exists()
    assert senior.email == demo_address("senior")
    seeded = len(seed_demo.DEMO_TASKS) + len(seed_demo.DEAD_LETTERS) + len(seed_demo.HISTORY)
    demo = Task.objects.filter(idempotency_key__startswith="demo:")
    fixed = demo.exclude(idempotency_key__startswith=seed_demo.FRESH_PREFIX)
    assert fixed.count() == seeded
    assert demo.count() == seeded + 2 * len(seed_demo.FRESH_BATCH)
    # An article waits for the demo editor, who is allowed to decide on it.
    editor = User.objects.get(username="editor")
    assert editor.groups.filter(name="editors").exists()
    waiting = Task.objects.get(idempotency_key="demo:publish:article-001:v1")
    assert waiting.status == TaskStatus.WAITING_APPROVAL
    request = ApprovalRequest.objects.get(task=waiting, status=ApprovalStatus.PENDING)
    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)
    assert waiting.steps.get(kind="publish").status == StepStatus.PENDING
    client = Client()
    password = first.split("admin")[1].split("password:")[1].split()[0]
    assert client.login(request=HttpRequest(), username="admin", password=password)
