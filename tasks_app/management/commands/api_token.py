"""``manage.py api_token``: make, list and revoke a person's API tokens from a shell, through
the same service as the console's Tokens page (``operations.tokens``); each make and revoke
is an event in the audit chain with the command's actor.

``make`` prints the token alone on stdout (so a script can keep it: ``TOKEN=$(...)``); it
is not shown again."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import CommandParser

from tasks_app.management.cli import OperatorCommand, actor_from, add_actor_argument, bad_input
from tasks_app.management.output import table, when
from tasks_app.models import ApiToken, AutoApply
from tasks_app.operations import tokens


class Command(OperatorCommand):
    help = "Make, list or revoke a user's API tokens (the console's Tokens page, from a shell)."

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(dest="verb", required=True)
        make = verbs.add_parser("make", help="make a token and print it (shown once)")
        make.add_argument("username")
        make.add_argument("--name", required=True, help="the program's name, e.g. triage-bot")
        make.add_argument("--group", required=True, help="the group whose permissions it takes")
        make.add_argument("--days", type=int, default=90, help="how long it is valid (90)")
        make.add_argument(
            "--auto-apply",
            default=AutoApply.NEVER,
            choices=AutoApply.values,
            help="which of its own plans it may apply without a person (never)",
        )
        add_actor_argument(make)
        listing = verbs.add_parser("list", help="a user's tokens (or everyone's)")
        listing.add_argument("username", nargs="?")
        revoke = verbs.add_parser("revoke", help="end a token now")
        revoke.add_argument("prefix", help="the token's prefix, as the list shows it")
        revoke.add_argument("--reason", required=True)
        add_actor_argument(revoke)

    def handle(self, *args: Any, **options: Any) -> None:
        getattr(self, f"_{options['verb']}")(options)

    def _make(self, options: dict[str, Any]) -> None:
        issued = tokens.issue(
            _user(options["username"]),
            name=options["name"],
            group=options["group"],
            days=options["days"],
            auto_apply=options["auto_apply"],
            actor=actor_from(options["actor"]),
        )
        self.stdout.write(issued.secret)

    def _list(self, options: dict[str, Any]) -> None:
        found = ApiToken.objects.select_related("user", "group").order_by("user__username", "name")
        if options["username"]:
            found = found.filter(user=_user(options["username"]))
        rows = [
            [
                token.prefix,
                token.user.username,
                token.name,
                token.group.name,
                token.auto_apply,
                when(token.expires_at),
                "revoked" if token.revoked_at else when(token.last_used_at),
            ]
            for token in found
        ]
        header = ["prefix", "user", "name", "group", "applies itself", "expires", "last used"]
        for line in table(header, rows):
            self.stdout.write(line)

    def _revoke(self, options: dict[str, Any]) -> None:
        token = ApiToken.objects.filter(prefix=options["prefix"]).first()
        if token is None:
            raise bad_input(f"prefix: no token {options['prefix']}")
        tokens.revoke(token, actor=actor_from(options["actor"]), reason=options["reason"])
        self.stdout.write(f"Revoked {token.name} ({token.prefix}) of {token.user.username}.")


def _user(username: str) -> User:
    user = User.objects.filter(username=username).first()
    if user is None:
        raise bad_input(f"username: no user {username}")
    return user
