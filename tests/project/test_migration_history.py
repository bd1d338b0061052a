"""Migrations are history: once landed, a migration's text never changes, since a database
migrated earlier never sees the edit (STYLE.md). ``migrations.sha256`` at the top of the
tree lists every landed migration with the SHA-256 of its text, in ``sha256sum`` form
(``sha256sum --check migrations.sha256`` checks it too). A new migration is added to the
list when it lands; a listed one never changes."""

from __future__ import annotations

import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIST = ROOT / "migrations.sha256"


def landed() -> dict[str, str]:
    entries: dict[str, str] = {}
    for line in LIST.read_text(encoding="utf-8").splitlines():
        digest, path = line.split(maxsplit=1)
        entries[path.lstrip("*")] = digest
    return entries


def on_disk() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(ROOT.glob("*/migrations/[0-9]*.py"))
    }


def test_no_landed_migration_has_changed() -> None:
    disk = on_disk()
    changed = sorted(path for path, digest in landed().items() if disk.get(path) != digest)
    assert not changed, (
        f"landed migrations changed or went missing: {changed}; a database migrated earlier "
        "never sees an edit: restore their text and add a new migration instead"
    )


def test_every_migration_is_listed() -> None:
    unlisted = sorted(on_disk().keys() - landed().keys())
    assert not unlisted, (
        f"migrations missing from migrations.sha256: {unlisted}; add each with "
        "`sha256sum <path> >> migrations.sha256` when it lands"
    )
