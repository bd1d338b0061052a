"""The path migration 0015 imports ``fingerprint`` by.

Migrations are history: once landed, their text never changes, so the names they import
stay importable here for as long as they exist. The cause's rule lives in
``tasks_app.engine.fingerprints``.
"""

from __future__ import annotations

from tasks_app.engine.fingerprints import fingerprint

__all__ = ["fingerprint"]
