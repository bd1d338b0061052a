"""The Limits page's cards (``console.limit_views``): each limit's use now in words, its
keys at their limit, and its forms, with what the last action on it left (a preview, an
error) for the person who took it.

The words are decided here, the templates only print them; the forms parse, and the rules
(a reason is required, the numbers' ranges and formats) are the services'
(``tasks_app.operations.limits``), whose :class:`InvalidInput` the views put on the field
it names.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django import forms

from tasks_app.engine.limits import Numbers, Rate
from tasks_app.models import Event, EventKind
from tasks_app.operations import limits
from tasks_app.operations.limit_use import KeyUse, LimitUse

# The keys at their limit a card lists, the tasks named per key, the keys offered to pick.
SHOWN_KEYS = 50
SHOWN_HOLDERS = 10
OFFERED_KEYS = 200
PERIODS = {1.0: "this second", 60.0: "this minute", 3600.0: "this hour"}
# The latest operator actions on limits a card shows (its own), out of the newest read.
SHOWN_CHANGES = 3
CHANGES_READ = 200
LIMIT_KINDS = (EventKind.LIMIT_CHANGED, EventKind.LIMIT_KEY_PAUSED, EventKind.LIMIT_KEY_RESUMED)


def reason_field() -> forms.CharField:
    # Every field is optional to Django: the service refuses an empty reason, naming it;
    # the browser marks it required and says so before sending.
    return forms.CharField(
        required=False, max_length=2000, widget=forms.Textarea({"rows": 2, "required": True})
    )


# --- forms: they parse; the rules are the services' -----------------------------------------


class ChangeForm(forms.Form):
    concurrency = forms.CharField(
        required=False,
        max_length=20,
        label="At once",
        help_text="Steps running at once (per key); 0 lets none start; blank for no cap.",
        widget=forms.TextInput({"inputmode": "numeric", "size": 8, "autocomplete": "off"}),
    )
    rate = forms.CharField(
        required=False,
        max_length=32,
        label="Rate",
        help_text="Starts per period (per key), such as 200/s, 1000/m or 50/10s; blank for none.",
        widget=forms.TextInput({"size": 12, "autocomplete": "off"}),
    )
    reason = reason_field()
    # The numbers in effect when the preview was made: a confirm made after someone else
    # changed them is refused, so nobody applies a preview of numbers no longer there.
    seen = forms.CharField(required=False, max_length=80, widget=forms.HiddenInput)


class ReasonForm(forms.Form):
    reason = reason_field()


class KeyForm(ReasonForm):
    key = forms.CharField(
        required=False,
        max_length=200,
        label="Key",
        help_text="Type a key or pick one this limit has seen.",
        widget=forms.TextInput({"autocomplete": "off", "required": True}),
    )
    field_order = ["key", "reason"]


def make_forms(name: str, data: Any = None) -> dict[str, forms.Form]:
    """A card's four forms, each with element ids of its own (``llm-change-rate``)."""
    made: dict[str, forms.Form] = {
        "change": ChangeForm(data, auto_id=f"{name}-change-%s"),
        "reset": ReasonForm(data, auto_id=f"{name}-reset-%s"),
        "pause": KeyForm(data, auto_id=f"{name}-pause-%s"),
        "resume": KeyForm(data, auto_id=f"{name}-resume-%s"),
    }
    # The keys the limit has seen, to pick from (the card's datalist).
    made["pause"].fields["key"].widget.attrs["list"] = f"{name}-keys"
    return made


# --- what a card says -----------------------------------------------------------------------


def period(rate: Rate) -> str:
    return PERIODS.get(rate.seconds, f"in the last {rate.seconds:g} s")


def key_words(key: KeyUse) -> str:
    """A key's use now: ``30/30 running; 812 of 1,000 this minute``."""
    cap = key.numbers.concurrency if key.numbers else None
    rate = key.numbers.rate if key.numbers else None
    words = [f"{key.running:,}/{cap:,} running" if cap is not None else f"{key.running:,} running"]
    if rate is not None:
        words.append(f"{key.spent or 0:,} of {rate.count:,} {period(rate)}")
    return "; ".join(words)


def limit_words(use: LimitUse) -> str:
    """The limit's use now: its one key's figures, or a partitioned limit's totals."""
    if not use.partitioned:
        key = use.keys[0] if use.keys else KeyUse("", 0, 0, None, use.numbers)
        return f"{key_words(key)}; {key.waiting:,} waiting"
    active = use.active_keys
    if not active:
        return "Nothing runs or waits under it now"
    stopped = len(use.at_limit)
    return (
        f"{use.running:,} running and {use.waiting:,} waiting across {active:,} "
        f"key{'' if active == 1 else 's'}; {stopped:,} at "
        f"{'its' if stopped == 1 else 'their'} limit"
    )


@dataclass(frozen=True)
class KeyRow:
    """One key at its limit, or held by its remote, as its row reads."""

    use: KeyUse
    words: str
    # When it lets a step in, as a moment, or as words when no moment is known.
    next_at: datetime | None
    next_words: str
    holders: tuple[int, ...]
    more_holders: int


def key_row(key: KeyUse) -> KeyRow:
    next_at, next_words = None, ""
    if key.paused_at is not None:
        next_words = "when someone resumes it"
    elif key.held_until or key.next_free:
        next_at = max(moment for moment in (key.held_until, key.next_free) if moment)
    elif key.at_concurrency:
        next_words = "when one of its running steps ends"
    else:
        next_words = "now"
    holders = key.holders[:SHOWN_HOLDERS]
    return KeyRow(
        key, key_words(key), next_at, next_words, holders, len(key.holders) - len(holders)
    )


@dataclass(frozen=True)
class Change:
    """An operator's action on a limit, as its card lists it (the audit log has them all,
    for those who may read it): on-call sees who changed what, when and why."""

    event: Event
    words: str


def _stored_numbers(value: Any) -> str:
    """A ``limit_changed`` event's numbers (``{"concurrency": 3, "rate": "10/m"}``)."""
    if not isinstance(value, dict):
        return "not known here"
    try:
        rate = value.get("rate")
        return limits.describe(
            Numbers(value.get("concurrency"), Rate.parse(rate) if rate else None)
        )
    except (TypeError, ValueError):
        return "not known here"


def change_words(event: Event) -> str:
    data = event.data if isinstance(event.data, dict) else {}
    if event.kind == EventKind.LIMIT_CHANGED:
        what = "changed" if data.get("live") else "put back"
        before, after = _stored_numbers(data.get("before")), _stored_numbers(data.get("after"))
        return f"{what} {before} → {after}"
    key = data.get("key") or ""
    verb = "paused" if event.kind == EventKind.LIMIT_KEY_PAUSED else "resumed"
    return f"{verb} key {key}" if key else verb


def recent_changes() -> dict[str, list[Change]]:
    """The latest actions on each limit, newest first: of the newest operator events of
    the limits' kinds (event_operator_idx, read backwards), a few per limit."""
    found: dict[str, list[Change]] = collections.defaultdict(list)
    events = Event.objects.filter(kind__in=LIMIT_KINDS).order_by("-id")[:CHANGES_READ]
    for event in events:
        name = event.data.get("limit") if isinstance(event.data, dict) else None
        if isinstance(name, str) and len(found[name]) < SHOWN_CHANGES:
            found[name].append(Change(event, change_words(event)))
    return found


@dataclass(frozen=True)
class Acted:
    """What an action on one limit leaves on its card for the person who took it: the
    forms as they were posted (None once it was done: fresh forms), a preview, an error."""

    name: str
    forms: dict[str, forms.Form] | None = None
    preview: limits.Preview | None = None
    error: str = ""


@dataclass
class Card:
    """One limit on the page: its figures and its forms."""

    use: LimitUse
    forms: dict[str, forms.Form]
    preview: limits.Preview | None = None
    error: str = ""
    # Its actions shown open: someone is using them.
    open: bool = False
    keys: list[KeyRow] = field(default_factory=list)
    more_keys: int = 0
    changes: list[Change] = field(default_factory=list)

    def __post_init__(self) -> None:
        stopped = [key for key in self.use.keys if key.at_limit or key.held_until]
        self.keys = [key_row(key) for key in stopped[:SHOWN_KEYS]]
        self.more_keys = len(stopped) - len(self.keys)

    @property
    def name(self) -> str:
        return self.use.name

    @property
    def words(self) -> str:
        return limit_words(self.use)

    @property
    def numbers(self) -> str:
        return limits.describe(self.use.numbers)

    @property
    def configured(self) -> str:
        return limits.describe(self.use.configured)

    @property
    def after(self) -> str:
        """The numbers a preview would set, in words."""
        return limits.describe(self.preview.after) if self.preview else ""

    @property
    def seen(self) -> str:
        return limits.stamp(self.use.numbers)

    @property
    def known_keys(self) -> list[str]:
        return [key.key for key in self.use.keys if key.key][:OFFERED_KEYS]

    @property
    def select_id(self) -> str:
        """Its figures' id as a CSS selector (a limit's name may hold a dot)."""
        return "#use-" + self.name.replace(".", "\\.")


def fresh_forms(use: LimitUse) -> dict[str, forms.Form]:
    """A card's forms, unbound: the change form starts from the numbers in effect."""
    made = make_forms(use.name)
    numbers = use.numbers
    if numbers is not None:
        made["change"].initial = {
            "concurrency": "" if numbers.concurrency is None else numbers.concurrency,
            "rate": str(numbers.rate or ""),
        }
    return made


def card(use: LimitUse, acted: Acted | None = None, changes: list[Change] | None = None) -> Card:
    if acted is None or acted.name != use.name:
        return Card(use, fresh_forms(use), changes=changes or [])
    made = acted.forms or fresh_forms(use)
    return Card(use, made, acted.preview, acted.error, open=True, changes=changes or [])
