"""``manage.py verify_audit``: recompute the audit chain and name its first broken link;
with ``--export FILE``, also check an audit export against the database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from console import audit_csv
from tasks_app.history import audit_verify
from tasks_app.history.audit_chain import Link
from tasks_app.management.cli import OperatorCommand, bad_input

BROKEN = 1


def _link(value: str) -> Link:
    """``ID:HASH`` or ``event ID HASH``, as the head is printed."""
    parts = value.replace("event", " ").replace(":", " ").split()
    if len(parts) != 2 or not parts[0].isdigit() or len(parts[1]) != 64:
        raise bad_input(f"head: {value!r} is not ID:HASH (an event id and its 64-digit hash)")
    return Link(int(parts[0]), parts[1].lower())


class Command(OperatorCommand):
    help = (
        "Recompute the audit chain (operator events, each hashed over the one before) from "
        "the latest retention checkpoint, or its beginning, and name the first broken link: "
        "a hash mismatch means the row was edited, a previous-hash mismatch that a row was "
        "deleted or inserted before it; an operator event without a hash after the chain "
        "began is named too. Prints the chain's head when it holds. With --head ID:HASH (a "
        "head printed earlier and kept elsewhere), also check that the chain still holds "
        "it, so deleting the newest events is found. With --export "
        "FILE, also check a CSV from /audit/export.csv: each row against the event it names "
        "(the chain hash among its cells) and its final chain-head line against the chain. "
        "Exit status 1 on a break or a difference, else 0."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--export",
            metavar="FILE",
            help="an audit export (CSV) to check against the database",
        )

        parser.add_argument(
            "--head",
            metavar="ID:HASH",
            help="a head printed earlier (event id and hash) that the chain must still hold",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        export = Path(options["export"]) if options["export"] else None
        exported = _link(options["head"]) if options["head"] else None
        if export is not None and not export.is_file():
            raise bad_input(f"export: no such file: {export}")
        verdict = audit_verify.verify()
        start = (
            f"the checkpoint at event {verdict.checkpoint.last_event_id} "
            f"({verdict.checkpoint.created_at:%Y-%m-%d %H:%M:%S %Z})"
            if verdict.checkpoint
            else "its beginning"
        )
        if verdict.broken is not None:
            raise CommandError(
                f"audit chain broken at {verdict.broken} "
                f"({verdict.checked} event(s) checked from {start})",
                returncode=BROKEN,
            )
        head = f"event {verdict.head.event_id} {verdict.head.hash}" if verdict.head else "none"
        if verdict.outside is not None:
            raise CommandError(
                f"audit chain intact ({verdict.checked} event(s) from {start}; head: {head}), "
                f"but {verdict.outside_count} operator event(s) are outside it, the first "
                f"{verdict.outside}",
                returncode=BROKEN,
            )
        if exported is not None and not audit_verify.holds(exported):
            raise CommandError(
                f"audit chain moved back: it no longer holds the head {exported} exported "
                f"earlier (now {head}), and no checkpoint recorded it: its newest events "
                "were deleted outside retention",
                returncode=BROKEN,
            )
        self.stdout.write(
            f"ok: audit chain verified, {verdict.checked} event(s) from {start}; head: {head}"
        )
        if exported is not None:
            self.stdout.write(f"ok: the chain holds the exported head {exported}")
        if export is not None:
            self._check_export(export)

    def _check_export(self, path: Path) -> None:
        with path.open(encoding="utf-8", newline="") as lines:
            check = audit_csv.check_export(lines)
        for problem in check.problems:
            self.stdout.write(problem)
        summary = (
            f"{check.rows} row(s), {check.chained} chained, {check.pruned} pruned since; "
            f"chain head: {check.head or 'none'}"
        )
        if not check.ok:
            raise CommandError(
                f"export {path} differs from the database in {len(check.problems)} place(s); "
                f"{summary}",
                returncode=BROKEN,
            )
        self.stdout.write(f"ok: export {path} matches the database; {summary}")
