"""The demo users of `make run`, and the file that keeps their passwords outside production.

A password exists in clear only when it is made, and `make run` prints that moment above
the log of three processes, where it scrolls away. Outside production mode each new
password is also written to ``VAR_DIR/demo-users.txt`` (mode 0600, one ``username
password`` line each), so this command can show it again once the web server answers.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

# username -> (groups, superuser)
DEMO_USERS: dict[str, tuple[tuple[str, ...], bool]] = {
    "editor": (("editors",), False),
    # A press release needs two editors' approvals; undecided, it escalates to seniors.
    "editor2": (("editors",), False),
    "senior": (("senior_editors",), False),
    "oncall": (("oncall",), False),
    "auditor": (("auditors",), False),
    "admin": ((), True),
}
FILE_NAME = "demo-users.txt"


def password_file() -> Path:
    return Path(settings.VAR_DIR) / FILE_NAME


def read_passwords() -> dict[str, str]:
    """The passwords on file by username; a missing file or a malformed line is none."""
    try:
        text = password_file().read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    passwords = {}
    for line in text.splitlines():
        username, _, password = line.strip().partition(" ")
        if username and password:
            passwords[username] = password
    return passwords


def write_password(username: str, password: str) -> None:
    """Record ``username``'s password, replacing the file in one rename so a reader never
    sees half of it. The file is made with mode 0600: nobody else on the machine reads it."""
    passwords = {**read_passwords(), username: password}
    path = password_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp creates the file with mode 0600 before anything is written to it.
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{FILE_NAME}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.writelines(f"{name} {secret}\n" for name, secret in sorted(passwords.items()))
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def demo_address(username: str) -> str:
    """A demo user's mail address: their mail is written to files, read on the Mail page."""
    return f"{username}@demo.example"


def create_demo_user(username: str) -> str | None:
    """Make the demo user ``username`` in its groups; returns its new password, or ``None``
    when the user already exists (its password is left alone). Outside production mode the
    password is also written to the password file."""
    groups, superuser = DEMO_USERS[username]
    password = secrets.token_urlsafe(12)
    with transaction.atomic():
        existing = User.objects.filter(username=username)
        if existing.exists():
            # Made before demo users had addresses: given one, so the demo's mail reaches them.
            existing.filter(email="").update(email=demo_address(username))
            return None
        user = User.objects.create_user(
            username=username,
            email=demo_address(username),
            password=password,
            is_staff=True,
            is_superuser=superuser,
        )
        user.groups.add(*Group.objects.filter(name__in=groups))
    if not settings.PRODUCTION:
        write_password(username, password)
    return password


def wait_for(url: str, *, timeout: float) -> bool:
    """Poll ``url`` until it answers with any HTTP status, or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    # Straight to the server: a proxy from the environment would answer for it.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while True:
        try:
            with opener.open(url, timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # an error page is still an answer: the server is up
        except (urllib.error.URLError, OSError):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)


class Command(BaseCommand):
    help = (
        "Show the demo users and their passwords (kept in VAR_DIR/demo-users.txt outside "
        "production mode), or give one a new password with --reset NAME."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--reset", metavar="NAME", choices=list(DEMO_USERS), help="set a new password"
        )
        parser.add_argument(
            "--wait-for",
            metavar="URL",
            help="first wait until this URL answers (the web server of `make run`)",
        )
        parser.add_argument(
            "--timeout", type=float, default=60.0, help="how long --wait-for waits (seconds)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.PRODUCTION:
            raise CommandError(
                "refused in production mode: demo passwords are not kept there "
                "(use manage.py changepassword)"
            )
        url = options["wait_for"]
        if url and not wait_for(url, timeout=options["timeout"]):
            self.stderr.write(f"{url} did not answer within {options['timeout']:g} s.")
        if options["reset"]:
            self._reset(options["reset"])
        else:
            self._show(login_url=url)

    def _reset(self, username: str) -> None:
        user = User.objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"there is no user {username} yet: run manage.py seed_demo")
        password = secrets.token_urlsafe(12)
        user.set_password(password)
        user.save(update_fields=["password"])
        write_password(username, password)
        self.stdout.write(f"  {username:8} password: {password}   (new; in {password_file()})")

    def _show(self, *, login_url: str | None) -> None:
        passwords = read_passwords()
        users = User.objects.in_bulk(list(DEMO_USERS), field_name="username")
        self.stdout.write(f"Demo users{f' (log in at {login_url})' if login_url else ''}:")
        for username in DEMO_USERS:
            user = users.get(username)
            known = passwords.get(username)
            if user is None:
                line = "not created yet: run manage.py seed_demo"
            # Checked, not trusted: the password may have been changed since it was filed.
            elif known and user.check_password(known):
                line = f"password: {known}"
            else:
                line = f"password unknown: reset it with manage.py demo_users --reset {username}"
            self.stdout.write(f"  {username:8} {line}")
