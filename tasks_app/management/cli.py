"""What the operator commands share: who acts, how bad input is refused, and the small
parsers for durations, task ids and payloads.

Every command goes through the same services, input rules and events as the console.
Bad input ends a command with one line naming the field and the rule and exit status 2,
before anything is stored; a service's refusal (:class:`InvalidInput`,
:class:`IdempotencyConflict`, :class:`InvalidTransition`, :class:`NotPermitted`) becomes
such a line too.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import sys
from collections.abc import Iterable
from datetime import timedelta
from typing import IO, Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import QuerySet

from tasks_app import services, validation
from tasks_app.exceptions import IdempotencyConflict, InvalidInput, InvalidTransition, NotPermitted
from tasks_app.models import Event, Step, Task, fingerprints
from tasks_app.operations import listings
from tasks_app.operations.task_actions import ACTIONS

BAD_INPUT = 2
REFUSALS = (InvalidInput, IdempotencyConflict, InvalidTransition, NotPermitted)
MAX_ACTOR_LENGTH = Event._meta.get_field("actor").max_length or 150
MAX_ERROR_CLASS_LENGTH = Step._meta.get_field("error_class").max_length or 200


def bad_input(message: str) -> CommandError:
    return CommandError(one_line(message), returncode=BAD_INPUT)


def one_line(text: str) -> str:
    return " ".join(text.split())


class _OneLineParser(CommandParser):
    """Django's parser, refusing bad arguments with one line and exit status 2 both from a
    shell (without the usage block) and through ``call_command``."""

    def error(self, message: str) -> NoReturn:
        if self.called_from_command_line:
            self.exit(BAD_INPUT, f"{self.prog}: error: {one_line(message)}\n")
        raise bad_input(message)


class OperatorCommand(BaseCommand):
    """A command whose bad input, and whose refusals by the services, end it with one line
    and exit status 2."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # Django builds the parser; only how it reports an error differs.
        parser.__class__ = _OneLineParser
        return parser

    def execute(self, *args: Any, **options: Any) -> str | None:
        try:
            return super().execute(*args, **options)
        except REFUSALS as exc:
            raise bad_input(str(exc)) from None


# --- who acts -------------------------------------------------------------------------------


def add_actor_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--actor",
        help="who acts, recorded on every event (default cli:<OS user>; a name without ':' "
        "is recorded as cli:<name>)",
    )


def os_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        # No login name in the environment and no passwd entry (a bare container).
        return f"uid-{os.getuid()}"


def actor_from(value: str | None) -> str:
    """The actor string a command records: ``cli:<OS user>`` by default; ``--actor``
    as given when it names its kind (``ops:alice``), else prefixed ``cli:``."""
    if value is None:
        return f"cli:{os_user()}"
    name = value.strip()
    if not name or not name.isprintable():
        raise bad_input("actor: a non-empty name of printable characters")
    actor = name if ":" in name else f"cli:{name}"
    if len(actor) > MAX_ACTOR_LENGTH:
        raise bad_input(f"actor: at most {MAX_ACTOR_LENGTH} characters")
    return actor


# --- durations and ids ----------------------------------------------------------------------

_DURATION = re.compile(r"(\d{1,9})([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
# Far enough back for any history, near enough that "now minus it" stays a date.
MAX_DURATION = timedelta(days=36_500)


def parse_duration(text: str, field: str) -> timedelta:
    """``30m``, ``2h``, ``7d``: a whole number and one unit (s, m, h, d or w)."""
    match = _DURATION.fullmatch(text.strip())
    rule = f"{field}: a duration such as 30m, 2h or 7d (a whole number and s, m, h, d or w)"
    if match is None:
        raise bad_input(rule)
    duration = timedelta(**{_UNITS[match[2]]: int(match[1])})
    if not timedelta(0) < duration <= MAX_DURATION:
        raise bad_input(f"{field}: more than 0 and at most {MAX_DURATION.days} days")
    return duration


def task_id(text: str) -> int:
    """An argparse type: a task id is a positive integer."""
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a task id (a positive integer)")
    return int(text)


def positive_int(text: str) -> int:
    """An argparse type for counts such as --limit."""
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def unique(values: Iterable[int]) -> list[int]:
    return list(dict.fromkeys(values))


# --- payloads ---------------------------------------------------------------------------------

# Raw input may be pretty-printed; the canonical payload is held to 64 KiB by the services.
MAX_PAYLOAD_INPUT = 1 << 20


def read_payload(text: str | None, path: str | None, *, stdin: IO[Any] | None = None) -> Any:
    """The payload of ``--payload JSON`` or ``--payload-file PATH`` (``-`` for either
    reads standard input), parsed; ``{}`` when neither is given. Whether it is a valid
    payload is the services' rule, checked there."""
    if text is not None and path is not None:
        raise bad_input("payload: give --payload or --payload-file, not both")
    if path == "-" or text == "-":
        raw = _read(stdin or sys.stdin, "stdin")
    elif path is not None:
        try:
            with open(path, "rb") as file:
                raw = _read(file, path)
        except OSError as exc:
            raise bad_input(f"payload_file: cannot read {path} ({exc.strerror})") from None
    else:
        raw = "{}" if text is None else text
    try:
        return json.loads(raw)
    except RecursionError:
        raise bad_input("payload: nesting too deep to parse") from None
    except ValueError as exc:
        raise bad_input(f"payload: not valid JSON ({exc})") from None


def _read(stream: IO[Any], name: str) -> str:
    source = getattr(stream, "buffer", stream)
    data = source.read(MAX_PAYLOAD_INPUT + 1)
    if len(data) > MAX_PAYLOAD_INPUT:
        raise bad_input(f"payload: {name} holds more than {MAX_PAYLOAD_INPUT} bytes")
    if isinstance(data, str):
        return data
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise bad_input(f"payload: {name} is not valid UTF-8") from None


# --- the operator actions: redrive, resolve, cancel, task_action ------------------------------


def add_param_arguments(parser: argparse.ArgumentParser, names: Iterable[str]) -> None:
    """A ``--<name>`` option for each parameter (but the reason) the named actions take
    for many tasks, with the table's help."""
    seen: set[str] = set()
    for name in names:
        for param in ACTIONS[name].bulk_params:
            if param.name in {"reason", *seen}:
                continue
            seen.add(param.name)
            parser.add_argument(f"--{param.name.replace('_', '-')}", help=param.help)


def action_params(action: str, options: dict[str, Any]) -> dict[str, Any]:
    """The parameters given (any the table knows but the reason), as the bulk service
    checks them: one ``action`` does not take is refused there, naming it."""
    names = {param.name for spec in ACTIONS.values() for param in spec.bulk_params}
    return {
        name: options[name] for name in sorted(names - {"reason"}) if options.get(name) is not None
    }


class TaskActionCommand(OperatorCommand):
    """An operator action on the tasks named by id, or on those a filter selects, through
    :func:`services.act_on_tasks`: one transaction and one event per task; a task the
    action does not apply to (any more) is skipped and reported."""

    # How many ids a dry run lists.
    PREVIEW = 20
    # The statuses the action applies to (its row's ``targets``), set when it runs.
    statuses: tuple[str, ...] = ()

    def action(self, options: dict[str, Any]) -> str:
        raise NotImplementedError

    def add_status_filters(self, filters: argparse._ArgumentGroup) -> None:
        """Filters only some actions have (cancel's ``--status``)."""

    def status_filters(self, options: dict[str, Any]) -> dict[str, Any]:
        return {}

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "ids", nargs="*", type=task_id, metavar="TASK_ID", help="the tasks to act on"
        )
        parser.add_argument("--reason", help="why (required; recorded on every event)")
        add_actor_argument(parser)
        parser.add_argument(
            "--limit",
            type=positive_int,
            help="act on at most this many tasks (default and cap: TASKS_BULK_LIMIT)",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="print how many tasks match and the first ids; change nothing",
        )
        filters = parser.add_argument_group("filters, instead of task ids")
        filters.add_argument("--workflow", help="a registered workflow name")
        filters.add_argument("--queue", help="one of TASKS_QUEUES")
        filters.add_argument("--error-class", help="the error class of a dead step")
        filters.add_argument(
            "--cause",
            metavar="FINGERPRINT",
            help="the cause of a dead step (its fingerprint, as task_status and /dead/groups/ "
            "show it)",
        )
        filters.add_argument(
            "--older-than", metavar="DURATION", help="created before now minus this: 30m, 2h, 7d"
        )
        self.add_status_filters(filters)

    def handle(self, *args: Any, **options: Any) -> None:
        action = self.action(options)
        actor = actor_from(options["actor"])
        limit = options["limit"] or services.bulk_limit()
        reason = options["reason"] or ""
        params = action_params(action, options)
        # The statuses the action applies to: what a filter selects from.
        self.statuses = ACTIONS[action].targets
        # The checks of a real run (the reason, the parameters, the limit), made on no
        # tasks: a dry run is refused exactly when the run would be, before anything is read.
        services.act_on_tasks(
            [], action=action, actor=actor, reason=reason, limit=limit, params=params
        )
        ids = unique(options["ids"])
        filters = self._filters(options)
        if ids and filters:
            raise bad_input("ids: give task ids or filters, not both")
        if not ids and not filters:
            raise bad_input(
                "filters: give task ids or at least one filter "
                "(refusing to act on every task at once)"
            )
        applicable: QuerySet[Task]
        chosen: QuerySet[Task]
        if ids:
            self._check_known(ids)
            applicable = listings.operator_targets(statuses=self.statuses, ids=ids)
            # All of them: the service says why it skips those it does not apply to.
            chosen = Task.objects.filter(pk__in=ids).order_by("id")
        else:
            applicable = chosen = listings.operator_targets(
                **{"statuses": self.statuses, **filters}
            )
        if options["dry_run"]:
            self._preview(action, applicable, ids, limit)
            return
        report = services.act_on_tasks(
            chosen[: limit + 1],
            action=action,
            actor=actor,
            reason=reason,
            limit=limit,
            params=params,
        )
        self._summarise(report, limit)

    def _filters(self, options: dict[str, Any]) -> dict[str, Any]:
        """The filters given, checked, as :func:`listings.operator_targets` takes them."""
        given: dict[str, Any] = {}
        if options["workflow"] is not None:
            names = listings.workflow_names()
            if options["workflow"] not in names:
                raise bad_input(f"workflow: must be one of {', '.join(names)}")
            given["workflow"] = options["workflow"]
        if options["queue"] is not None:
            given["queue"] = validation.validate_queue(options["queue"])
        if options["error_class"] is not None:
            error_class = options["error_class"].strip()
            if not 1 <= len(error_class) <= MAX_ERROR_CLASS_LENGTH:
                raise bad_input(f"error_class: 1 to {MAX_ERROR_CLASS_LENGTH} characters")
            given["error_class"] = error_class
        if options["cause"] is not None:
            if not re.fullmatch(fingerprints.CAUSE_PATTERN, options["cause"]):
                raise bad_input(f"cause: {fingerprints.CAUSE_RULE}")
            given["fingerprint"] = options["cause"]
        if options["older_than"] is not None:
            age = parse_duration(options["older_than"], "older_than")
            given["created_before"] = services.db_now() - age
        return {**given, **self.status_filters(options)}

    @staticmethod
    def _check_known(ids: list[int]) -> None:
        known = set(Task.objects.filter(pk__in=ids).values_list("pk", flat=True))
        missing = [str(pk) for pk in ids if pk not in known]
        if missing:
            raise bad_input(f"ids: no task with id {', '.join(missing)}")

    def _preview(self, action: str, applicable: QuerySet[Task], ids: list[int], limit: int) -> None:
        count = applicable.count()
        first = list(applicable.values_list("pk", flat=True)[: self.PREVIEW])
        line = f"{action} (dry run, nothing changed): {count} task(s) match"
        if ids:
            line = f"{action} (dry run, nothing changed): {count} of {len(ids)} task(s) apply"
        if count > limit:
            line += f"; the first {limit} would be acted on (--limit)"
        self.stdout.write(line)
        if first:
            more = f" (and {count - len(first)} more)" if count > len(first) else ""
            self.stdout.write(f"first ids: {', '.join(map(str, first))}{more}")
        if ids and count < len(ids):
            applying = set(applicable.values_list("pk", flat=True))
            others = ", ".join(str(pk) for pk in ids if pk not in applying)
            self.stdout.write(f"would skip (not {' or '.join(self.statuses)}): {others}")

    def _summarise(self, report: services.BulkReport, limit: int) -> None:
        line = f"{report.action}: {len(report.changed)} changed, {len(report.skipped)} skipped"
        if report.limited:
            line += f"; more matched than the limit of {limit} and were left alone"
        self.stdout.write(line)
        if report.changed:
            self.stdout.write(f"changed: {', '.join(map(str, report.changed))}")
        for pk, why in report.skipped:
            self.stdout.write(f"skipped {pk}: {one_line(why)}")


# --- queues -----------------------------------------------------------------------------------


class QueueSwitchCommand(OperatorCommand):
    """pause_queue and resume_queue."""

    pause: bool

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the queue, one of TASKS_QUEUES")
        parser.add_argument("--reason", help="why (required; recorded on the event)")
        add_actor_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        name, actor = options["name"], actor_from(options["actor"])
        verb = "paused" if self.pause else "resumed"
        was_paused = name in services.paused_queues()
        switch = services.pause_queue if self.pause else services.resume_queue
        switch(name, actor=actor, reason=options["reason"] or "")
        if was_paused == self.pause:
            state = "paused" if self.pause else "running"
            self.stdout.write(f"queue {name} is already {state}; nothing changed")
        else:
            self.stdout.write(f"queue {name} {verb} by {actor}")
