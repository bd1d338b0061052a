"""The path the landed migrations import the online operations by.

Migrations are history: once landed, their text never changes, so the names they import
stay importable here for as long as they exist. The operations live in
``tasks_app.db.online_migrations``; new migrations import them from there.
"""

from __future__ import annotations

from tasks_app.db.online_migrations import *  # noqa: F403
from tasks_app.db.online_migrations import __all__ as __all__
