"""Signals the core sends for apps that build on it (the core imports none of them)."""

from __future__ import annotations

from django.dispatch import Signal

# Sent inside the cancelling transaction with ``task``, ``steps`` (the rows just
# cancelled), ``actor`` and ``reason``: an app that keeps its own records for waiting steps
# (approval requests) closes them in the same commit.
steps_cancelled = Signal()
