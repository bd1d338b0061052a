"""Django looks for an app's admin here: the task system's admin registers in
``tasks_app.integrations.admin`` when this module is imported."""

from __future__ import annotations

from tasks_app.integrations import admin as _registrations  # noqa: F401
