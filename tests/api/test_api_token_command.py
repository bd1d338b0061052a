"""``manage.py api_token``: a token made from a shell works with the API, is listed, and
once revoked is refused; bad input names the field and stores nothing."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from tasks_app.models import ApiToken, Event, EventKind
from tests.api_support import call


def run(*args: str) -> str:
    out = StringIO()
    call_command("api_token", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_a_token_made_in_a_shell_reads_the_api_until_it_is_revoked(oncall: User) -> None:
    secret = run("make", oncall.username, "--name", "deploy-bot", "--group", "oncall").strip()
    assert secret.startswith("tc_")
    assert call("GET", "/api/v1/tasks/", secret).status_code == 200
    token = ApiToken.objects.get(name="deploy-bot")
    assert token.digest != secret and secret not in token.digest
    listed = run("list", oncall.username)
    assert token.prefix in listed and "deploy-bot" in listed
    assert "Revoked deploy-bot" in run(
        "revoke", token.prefix, "--reason", "rotated", "--actor", "ops:ann"
    )
    assert call("GET", "/api/v1/tasks/", secret).status_code == 401
    kinds = list(Event.objects.filter(actor__in=["ops:ann"]).values_list("kind", flat=True))
    assert kinds == [EventKind.TOKEN_REVOKED]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["make", "olivia-oncall", "--name", "x", "--group", "auditors"], "group"),
        (["make", "olivia-oncall", "--name", "Has Space", "--group", "oncall"], "name"),
        (["make", "olivia-oncall", "--name", "x", "--group", "oncall", "--days", "0"], "days"),
        (["make", "nobody", "--name", "x", "--group", "oncall"], "username"),
        (["revoke", "nope", "--reason", "x"], "prefix"),
    ],
)
def test_bad_input_names_the_field_and_stores_nothing(
    oncall: User, args: list[str], field: str
) -> None:
    with pytest.raises(CommandError, match=rf"^{field}:") as refused:
        run(*args)
    assert refused.value.returncode == 2
    assert not ApiToken.objects.exists()
