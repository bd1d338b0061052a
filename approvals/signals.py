"""What the approvals app announces to the rest of it: a request opened (``request``),
sent in the transaction that opened it. ``approvals.notices`` tells its approvers."""

from __future__ import annotations

from django.dispatch import Signal

request_opened = Signal()
