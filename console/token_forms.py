"""The forms of the Tokens page (``console.token_views``): make a token, and revoke one.

Forms parse; the rules (a name's characters and its uniqueness among a person's live
tokens, the groups a person may take permissions from, the days' range, the auto-apply
choices, a revoke's reason) are the service's (``tasks_app.operations.tokens``), whose
:class:`InvalidInput` the views put on the field it names. Each revoke form's element ids
are its token's own (``revoke-7-reason``), as one page holds one per live token.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.models import User

from tasks_app.models import AutoApply
from tasks_app.operations import tokens

# How long a new token is valid for unless its maker says otherwise (at most the setting).
DEFAULT_DAYS = 90


class TokenForm(forms.Form):
    # Text fields, the choices under selects: an unknown group or choice is refused by the
    # service, by name.
    name = forms.CharField(
        required=False,
        max_length=200,
        label="Name",
        help_text="The program's name, as events and the plans' inbox show it: up to 64 of "
        "a-z, 0-9, '-', '_' and '.' (triage-bot).",
        widget=forms.TextInput(
            {"required": True, "maxlength": 64, "autocomplete": "off", "spellcheck": "false"}
        ),
    )
    group = forms.CharField(
        required=False,
        max_length=150,
        label="Permissions of",
        help_text="The token may do what this group may and you may, no more.",
        widget=forms.Select,
    )
    days = forms.CharField(
        required=False,
        max_length=20,
        label="Valid for (days)",
        widget=forms.NumberInput({"required": True, "min": 1}),
    )
    auto_apply = forms.CharField(
        required=False,
        max_length=20,
        label="Plans it may apply itself",
        help_text="Any other plan it proposes waits for you or a colleague to sign it here.",
        widget=forms.Select(choices=AutoApply.choices),
    )

    def __init__(self, user: User, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", "token-%s")
        super().__init__(*args, **kwargs)
        most: int = settings.API_TOKEN_MAX_DAYS
        self.offered = list(tokens.offered_groups(user).values_list("name", flat=True))
        group = self.fields["group"]
        group.widget.choices = [(name, name) for name in self.offered]
        days = self.fields["days"]
        days.widget.attrs["max"] = most
        days.help_text = f"From 1 to {most}."
        self.initial = {
            "days": min(DEFAULT_DAYS, most),
            "auto_apply": AutoApply.NEVER,
            **self.initial,
        }


class RevokeForm(forms.Form):
    reason = forms.CharField(
        required=False,
        max_length=2000,
        label="Reason",
        widget=forms.TextInput({"required": True, "autocomplete": "off"}),
    )

    def __init__(self, token_id: int, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", f"revoke-{token_id}-%s")
        super().__init__(*args, **kwargs)
        self.token_id = token_id
