"""The demo seed (``manage.py seed_demo``) for the tests of what it leaves: run in the test's
process, or once for a whole module (:func:`seeded`), which its tests only read or change
inside their own savepoint."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings

from tests.conftest import ensure_groups

# The hasher the suite's personas use (conftest's ``_fast_password_hashing``, which is made
# per test, after a module's fixtures).
FAST_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def seed() -> str:
    out = StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue()


def demo_users(*args: str) -> str:
    out = StringIO()
    call_command("demo_users", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.fixture
def var_dir(settings: Any, tmp_path: Path) -> Path:
    settings.VAR_DIR = tmp_path
    settings.PRODUCTION = False
    # A transactional test before this one may have flushed the migration-made groups.
    ensure_groups()
    return tmp_path


@pytest.fixture(scope="module")
def seeded(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """The demo seeded once for the module, as a first ``seed_demo`` leaves it, in a
    transaction rolled back after the module's last test. Each test runs in a savepoint
    inside it (pytest-django's ``db``), so what one test changes the next does not see.
    Yields the password file the seed wrote."""
    folder = tmp_path_factory.mktemp("seeded-var")
    outer = transaction.atomic()
    with django_db_blocker.unblock():
        outer.__enter__()
        try:
            with override_settings(VAR_DIR=folder, PRODUCTION=False, PASSWORD_HASHERS=FAST_HASHERS):
                ensure_groups()
                seed()
        except BaseException as error:
            outer.__exit__(type(error), error, error.__traceback__)
            raise
    try:
        yield folder / "demo-users.txt"
    finally:
        with django_db_blocker.unblock():
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)
