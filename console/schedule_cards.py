"""The Schedules pages' cards (``console.schedule_views``): where each schedule stands
(``tasks_app.operations.schedule_use.standing``) in words and in the reader's time zone,
and on a schedule's own page its forms, with what the last action on it left (a preview,
an error) for the person who took it.

The words are decided here, the templates only print them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django import forms

from console.schedule_forms import MODE_WORDS, ConfirmForm, fresh_forms
from console.schedule_zones import Moment, ViewerZone, local_input, moment
from tasks_app.engine.schedules import Missed, parse_slot, tolerance_of
from tasks_app.models import RunOutcome
from tasks_app.operations.durations import short_duration
from tasks_app.operations.schedule_sync import Change
from tasks_app.operations.schedule_use import Run, Standing, describe_seconds
from tasks_app.operations.schedules import SchedulePlan

# The last runs and missed slots a card on the list shows (its own page shows all that
# ``standing`` reads); the slots a preview lists.
LISTED_RUNS = 5
PREVIEW_SLOTS = 50
# Each outcome's badge: the status colours that say the same.
OUTCOME_BADGES: dict[str, str] = {
    RunOutcome.ENQUEUED: "status-pending",
    RunOutcome.RUN_NOW: "status-running",
    RunOutcome.MISSED: "status-waiting_approval",
    RunOutcome.REFUSED: "status-dead",
}
STATE_BADGES = {
    "active": "status-succeeded",
    "paused": "status-waiting_approval",
    "late": "status-dead",
    "removed": "status-cancelled",
}


def policy_words(spec: dict[str, Any]) -> str:
    """What a tick does with slots found older than the tolerance."""
    policy = spec.get("missed")
    if policy == Missed.LATEST:
        words = "after an outage the newest missed slot runs once"
    elif policy == Missed.EACH:
        words = f"each missed slot runs, at most the newest {spec.get('max_missed')}"
    else:
        words = "missed slots are recorded, not run"
    tolerance = tolerance_of(spec).total_seconds()
    late = f"more than {describe_seconds(tolerance)} " if tolerance else ""
    return f"{policy}: {words}; a slot counts as missed when a tick finds it {late}past its time"


@dataclass(frozen=True)
class RunRow:
    """One decided slot or run now, as a row reads."""

    run: Run
    slot: Moment

    @property
    def outcome(self) -> str:
        return str(RunOutcome(self.run.run.outcome).label)

    @property
    def badge(self) -> str:
        return OUTCOME_BADGES.get(str(self.run.run.outcome), "")


@dataclass(frozen=True)
class Preview:
    """A resume's or a backfill's plan as its preview shows it, with the confirm form
    carrying it signed."""

    plan: SchedulePlan
    token: str
    confirm: ConfirmForm
    enqueue: list[Moment]
    missed: list[Moment]
    more: int
    # A backfill's range as the preview read it.
    since: Moment | None = None
    until: Moment | None = None

    @property
    def text(self) -> str:
        return self.plan.text

    @property
    def mode(self) -> str:
        """How a resume decides the slots missed while paused."""
        return MODE_WORDS.get(self.plan.mode, self.plan.mode)

    @property
    def confirmable(self) -> bool:
        """Whether confirming does anything: a backfill finding no slot to enqueue does not."""
        return self.plan.action == "resume" or bool(self.plan.enqueue)

    @property
    def button(self) -> str:
        """The confirm button's words: "Resume and enqueue 3 runs"."""
        count = len(self.plan.enqueue)
        runs = f"{count} run{'' if count == 1 else 's'}"
        if self.plan.action == "resume":
            return f"Resume and enqueue {runs}" if count else "Resume, enqueuing no run"
        return f"Backfill {runs}"


def preview(plan: SchedulePlan, token: str, zone: ViewerZone, confirm: ConfirmForm) -> Preview:
    slots = [moment(parse_slot(slot), zone) for slot in plan.enqueue]
    missed = [moment(parse_slot(slot), zone) for slot in plan.missed]
    shown = PREVIEW_SLOTS
    more = max(len(slots) - shown, 0) + max(len(missed) - shown, 0)
    since = moment(parse_slot(plan.since), zone) if plan.since else None
    until = moment(parse_slot(plan.until), zone) if plan.action == "backfill" else None
    return Preview(plan, token, confirm, slots[:shown], missed[:shown], more, since, until)


@dataclass(frozen=True)
class Acted:
    """What an action on a schedule leaves on its card for the person who took it: the
    form as posted (the others fresh), a preview, an error."""

    action: str = ""
    form: forms.Form | None = None
    preview: Preview | None = None
    error: str = ""


@dataclass
class Card:
    """One schedule on a page: where it stands and, on its own page, its forms."""

    standing: Standing
    zone: ViewerZone
    # What code declares for it that is not stored yet (``sync_schedules`` stores it).
    pending: list[Change] = field(default_factory=list)
    full: bool = False
    acted: Acted = field(default_factory=Acted)
    forms: dict[str, forms.Form] = field(init=False)

    def __post_init__(self) -> None:
        self.forms = fresh_forms(self._initial())
        if self.acted.form is not None:
            self.forms[self.acted.action] = self.acted.form
        # "Follow the schedule's policy" names it.
        mode = self.forms["resume"].fields["mode"]
        mode.widget.choices = [
            (value, f"{words} ({self.spec.get('missed')})" if value == "policy" else words)
            for value, words in MODE_WORDS.items()
        ]

    def _initial(self) -> dict[str, dict[str, Any]]:
        """A backfill starts from the missed slots shown: the oldest to the newest."""
        initial: dict[str, Any] = {"zone": self.zone.name}
        missed = self.standing.missed
        if missed:
            initial["since"] = local_input(missed[-1].slot, self.zone)
            initial["until"] = local_input(missed[0].slot, self.zone)
        return {"backfill": initial}

    @property
    def schedule(self) -> Any:
        return self.standing.schedule

    @property
    def name(self) -> str:
        return str(self.schedule.name)

    @property
    def spec(self) -> dict[str, Any]:
        return self.standing.spec

    @property
    def state(self) -> str:
        return self.standing.state

    @property
    def state_badge(self) -> str:
        return STATE_BADGES[self.state]

    @property
    def late_words(self) -> str:
        """How late a late schedule's oldest undecided slot is, and what that means."""
        if self.state != "late":
            return ""
        return (
            f"Its next slot is {short_duration(self.standing.overdue)} past its tolerance and "
            "no tick has decided it: are beat and the maintenance worker running?"
        )

    @property
    def timing(self) -> str:
        return self.standing.timing

    @property
    def policy(self) -> str:
        return policy_words(self.spec)

    @property
    def next_runs(self) -> list[Moment]:
        return [moment(slot, self.zone) for slot in self.standing.next_runs]

    @property
    def last_runs(self) -> list[RunRow]:
        runs = self.standing.last_runs if self.full else self.standing.last_runs[:LISTED_RUNS]
        return [RunRow(run, moment(run.run.slot, self.zone)) for run in runs]

    @property
    def missed(self) -> list[Moment]:
        missed = self.standing.missed if self.full else self.standing.missed[:LISTED_RUNS]
        return [moment(run.slot, self.zone) for run in missed]

    @property
    def missed_unlisted(self) -> int:
        """Missed slots counted but not listed here (older ones, or a long gap's)."""
        return max(int(self.schedule.missed_total) - len(self.missed), 0)

    @property
    def waiting(self) -> list[Moment]:
        """Slots due and not yet decided: a paused schedule's, decided when it resumes."""
        return [moment(slot, self.zone) for slot in self.standing.waiting]

    @property
    def waiting_more(self) -> bool:
        return self.standing.waiting_more

    @property
    def pending_words(self) -> list[str]:
        return [str(change) for change in self.pending]

    @property
    def error(self) -> str:
        return self.acted.error

    @property
    def resume_preview(self) -> Preview | None:
        return self.acted.preview if self.acted.action == "resume" else None

    @property
    def backfill_preview(self) -> Preview | None:
        return self.acted.preview if self.acted.action == "backfill" else None
