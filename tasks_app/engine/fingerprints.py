"""Where migration ``0015_dead_letter_causes`` finds the fingerprint it stores: a landed
migration's text never changes, so this name stays for it. Code imports
``tasks_app.models.fingerprints``."""

from __future__ import annotations

from tasks_app.models.fingerprints import fingerprint

__all__ = ["fingerprint"]
